"""The artifact: a compiled model on disk (``model.tsc/``), written by ``tscomp compile`` and read
by the :class:`~tscomp.runtime.Runtime` (TSCompiler §6: the runtime loader's input).

Layout::

    model.tsc/
      manifest.json     the single source of truth: format version; symbols with ranges and
                        constraints; inputs/outputs with symbolic shapes and dtypes; groups with
                        their kernel variants (family, target, tile config, resource use, measured
                        single-wave time); the sha256 of every other file; ``digest``, a sha256 over
                        all of that (so over every file): the artifact's identity
      plan.json         the Plan and the kernel objects as plain data (:mod:`tscomp.runtime.plain_data`:
                        an object table whose classes are tscomp's own, SymPy trees, array blobs)
      weights.bin       every array once, 64-byte aligned, content addressed: graph constants and
                        each GEMM's and Conv's raw weight (packed at load, once per layout --
                        a GEMM's register-tile width, a Conv's MR or depthwise strategy: the
                        variants share those copies, and the file stores none of them)
      kernels.so        every generated kernel linked into one shared library -- the only code
      kernels/*.c       their sources (what a person reads to debug a kernel)
      model/            (``embed_source`` only) the ONNX model, for the out-of-range fallback

``precision`` (issue 13) records the GEMM precision the kernels were generated for (``fp32``, or
``bf16``: the gemm family's weights are packed as bf16 and its inner products use AVX512_BF16), with
``precision_scope`` saying which families it applies to; it is part of the manifest and so of the
digest. Loading a bf16 artifact on a CPU without avx512_bf16 is refused with a clear error before any
kernel is loaded.

Loading reads the manifest first and checks its format version and digest (and a caller's
``expected_digest``), then that every file it lists is present with the recorded sha256, that every
file the artifact needs is listed and that no unlisted file is there -- all before any other file
is parsed. Nothing in the artifact is pickled; the plan is decoded without running code it names.
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import warnings
import json
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np

from tscomp.codegen.build import build_object, link_library, load_library
from tscomp.codegen.native import sha256_text
from tscomp.runtime.host_library import HOST_NAME
from tscomp.compiler import CompiledModel
from tscomp.errors import TscompError
from tscomp.graph.symbols import shape_str
from tscomp.runtime import plain_data
from tscomp.runtime.packing import PACKERS
from tscomp.runtime.plain_data import BlobReader, BlobWriter, PlainDataError, read_aligned
from tscomp.schedule.target import Target

FORMAT = "tscomp-artifact"
FORMAT_VERSION = 13    # 2: the target as data, per-variant schedule provenance; 3: plain data, no pickle;
                       # 4: GEMM row tails (the wave model counts a GEMM task's exact rows);
                       # 5: bf16 weight K blocks padded to 32 (one layout for VDPBF16PS and AMX);
                       # 6: GEMM weights in nr-column panels over all of K (variants of one nr share them);
                       # 7: GEMM row blocks dealt by register tile and evened over the threads;
                       # 8: int8 GEMMs (a kernel's x_offset, its weights' int32 column corrections);
                       # 9: int8 Convs (a Conv kernel's precision and x_offset, s8 quad panels);
                       # 10: int8 GEMM weight K blocks padded to 64 (one layout for VPDPBUSD and AMX
                       #     int8 tiles: a format-9 kernel would read the new panels wrong);
                       # 11: Conv position blocks dealt by register tile (the wave model's task classes
                       #     of a format-10 Conv kernel would not match how its C splits the positions)
                       # 12: Conv column-vector tiles compute a last partial position tile in whole
                       #     vectors (a format-11 kernel pads it to the full tile: costed otherwise)
                       # 13: a Conv analysis records its in-place epilogue for column-vector tiles into
                       #     a channel-blocked output (epilogue_in_place_c; a format-12 one lacks it)


class ArtifactError(TscompError):
    """An artifact directory that cannot be loaded (missing, other format version, corrupt)."""


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def _tensor_spec(graph, name: str) -> dict:
    v = graph.values[name]
    return {"name": name, "dtype": str(np.dtype(v.dtype)), "shape": [str(d) for d in v.shape]}


def _variant_entry(kernel) -> dict:
    entry = {"family": kernel.family, "target": kernel.target, "func": kernel.func}
    if getattr(kernel, "precision", None) is not None:    # gemm, conv: the load check reads it
        entry["precision"] = kernel.precision
    if getattr(kernel, "isa", None):
        entry["isa"] = kernel.isa          # the load check refuses AMX kernels on a CPU without the tiles
    cfg = kernel.cfg
    if cfg is not None:
        entry["tile_config"] = {k: int(v) for k, v in vars(cfg).items() if isinstance(v, (int, np.integer))}
        entry["tile_config_text"] = cfg.describe()
    resources = kernel.resources()
    if resources:
        entry["resources"] = resources
    if kernel.tuning:
        entry["schedule"] = dict(kernel.tuning)
    if kernel.t_wave is not None:
        entry["single_wave_us"] = round(kernel.t_wave * 1e6, 3)
        entry["measured_at"] = kernel.probe
    if kernel.samples:
        entry["samples"] = [{"size": s[0], "tasks": s[1], "us": round(s[2] * 1e6, 3),
                             **({"work": s[3]} if len(s) > 3 else {}),
                             **({"task_classes": [list(c) for c in s[4]]} if len(s) > 4 else {})}
                            for s in kernel.samples]
    if kernel.reasons:
        entry["why_no_native_kernel"] = list(kernel.reasons)
    return entry


def manifest_of(model: CompiledModel) -> dict:
    plan, graph = model.plan, model.plan.graph
    symtab = graph.symbols
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "source_model": model.source_model, "dims": list(model.dims), "target": model.target.to_json(),
        "isa": model.isa, "threads_measured": model.threads, "configs": model.config_source,
        "precision": model.target.precision, "precision_scope": _precision_scope(model),
        "schedule": model.schedules.to_json() if model.schedules is not None else None,
        "compile_seconds": round(model.compile_seconds, 2),
        "symbols": [{"name": i.name, "min": i.min, "max": i.max, "origin": i.origin}
                    for i in symtab.live_symbols()],
        "constraints": [str(c) for c in symtab.constraints],
        "inputs": [_tensor_spec(graph, n) for n in graph.inputs],
        "outputs": [_tensor_spec(graph, n) for n in graph.outputs],
        "rewrites": list(plan.rewrites),
        "groups": [{"name": g.name, "kind": g.kind, "backbone": g.backbone, "ops": list(g.nodes),
                    "inputs": list(g.inputs), "outputs": list(g.outputs),
                    "space": shape_str(g.iteration_space()),
                    "variants": [_variant_entry(k) for k in model.kernels[g.name]]}
                   for g in plan.groups],
        "notes": list(model.notes),
    }


#: how a GEMM or Conv kernel of integer operands computes, per precision (an fp32 model's quantized
#: GEMMs and Convs)
INTEGER_GEMMS = {"bf16": "on bf16 operands, which hold those integers exactly: the same sums",
                 "int8": "on int8 instructions (VPDPBUSD, or TDPBUSD on AMX tiles), exact int32 sums converted to "
                         "fp32 once"}
#: the same, naming the instructions where the kernels' ISA says which
INTEGER_GEMMS_ON = {("int8", "amx"): "on AMX int8 tiles (TDPBUSD), exact int32 sums converted to fp32 once",
                    ("int8", "avx512"): "on int8 instructions (VPDPBUSD), exact int32 sums converted to fp32 once"}


def _precision_scope(model: CompiledModel) -> str:
    target = model.target
    precision = target.precision
    if precision == "fp32":
        exact = Counter(getattr(k, "precision", "fp32") for ks in model.kernels.values() for k in ks)
        return "every kernel computes in fp32" + "".join(f", {n} GEMM or Conv kernel(s) of integer operands (a quantized "
                                                         f"model's) {INTEGER_GEMMS[p]}"
                                                         for p, n in sorted(exact.items()) if p != "fp32")
    from tscomp.codegen.families import bf16_families
    gemm = f"{precision} inner products (fp32 accumulation) in the gemm family (constant weights packed as {precision})"
    if "attention" in bf16_families(target):
        return (f"{gemm} and in the fused attention's QKᵀ and P·V (AMX tiles, softmax in fp32); attention as "
                f"batched GEMMs, Conv and every non-GEMM op compute in fp32")
    return f"{gemm}; attention (fused or as batched GEMMs), Conv and every non-GEMM op compute in fp32"


def check_host_precision(path, manifest: dict) -> None:
    """Refuse an artifact whose precision this CPU cannot run (bf16 without avx512_bf16, or GEMM kernels
    on AMX tiles -- bf16 or int8 -- where the CPU has none)."""
    from tscomp.schedule.target import TargetError, check_precision, host_cpu

    precision = manifest.get("precision", "fp32")
    host = host_cpu().spec
    try:
        check_precision(precision, host)
    except TargetError as exc:
        raise ArtifactError(f"{path}: compiled with --precision {precision}, which this CPU cannot run: {exc}") \
            from None
    # an fp32 artifact's integer-operand GEMMs and Convs (a quantized model's) run in int8 or bf16
    # where the compiling CPU could
    exact: dict[str, list] = {}
    for g in manifest.get("groups", ()):
        for v in g.get("variants", ()):
            if v.get("precision", precision) not in (precision, "fp32"):     # fp32 runs anywhere
                exact.setdefault(v["precision"], []).append(v["func"])
    for kind, funcs in sorted(exact.items()):
        try:
            check_precision(kind, host)
        except TargetError as exc:
            raise ArtifactError(f"{path}: {len(funcs)} kernel(s) (e.g. {funcs[0]}) compute their integer "
                                f"operands in {kind}, which this CPU cannot run: {exc}; recompile the model on this "
                                f"machine") from None
    for kind, granted in (("bf16", host.amx), ("int8", host.amx_int8)):
        amx = sorted({v["func"] for g in manifest.get("groups", ()) for v in g.get("variants", ())
                      if v.get("isa") == "amx" and v.get("precision", precision) == kind})
        if amx and not granted:
            raise ArtifactError(f"{path}: {len(amx)} kernel(s) (e.g. {amx[0]}) run on AMX {kind} tiles, which this "
                                f"CPU does not have (or the OS does not grant); recompile the model on this machine")


def write_artifact(model: CompiledModel, path: str | Path, *, progress=None, embed_source: bool = False) -> Path:
    """Write ``model`` to the directory ``path``, atomically: everything is written into a unique
    temporary directory beside ``path`` and swapped in by rename only once complete, so a failed
    or interrupted write (an exception, Ctrl-C) leaves the previous artifact as it was and no
    temporary directory behind, and concurrent writers to one path end with one complete
    artifact (the last to swap). ``path`` may only replace an existing tscomp artifact.
    ``embed_source`` copies the ONNX model in (for the out-of-range fallback; otherwise that path
    reads the source model the manifest names)."""
    path = Path(path)
    if path.exists() and not (path / "manifest.json").exists():
        raise ArtifactError(f"{path} exists and is not a tscomp artifact; not overwriting it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + ".tmp-"))
    try:
        os.chmod(tmp, 0o777 & ~_umask())       # mkdtemp makes it private; an artifact is not
        _write_contents(model, tmp, progress, embed_source)
        _swap_in(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


#: renameat2 flag: exchange the two paths atomically (Linux ≥ 3.15)
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap the directories ``a`` and ``b`` (Linux ``renameat2``); False where the
    system cannot, or ``b`` does not exist."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    at_fdcwd = -100
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _swap_in(tmp: Path, path: Path, attempts: int = 50) -> None:
    """Move the complete artifact ``tmp`` to ``path``. A reader sees the old artifact or the new
    one, never a mix: where ``renameat2`` exchanges directories, the swap is one atomic step;
    otherwise the old artifact is renamed aside, the new one renamed in, and the old removed
    (between the two renames ``path`` is briefly absent, never half written). ``tmp`` is gone
    on return (it holds the old artifact after an exchange, and is removed)."""
    for _ in range(attempts):
        try:
            os.rename(tmp, path)                # no artifact there yet (or an empty directory)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        if _exchange(tmp, path):
            shutil.rmtree(tmp, ignore_errors=True)
            return
        aside = path.with_name(f"{path.name}.old-{uuid.uuid4().hex[:12]}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:               # a concurrent writer moved it first: retry
            continue
        try:
            os.rename(tmp, path)
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                os.rename(aside, path)          # put the old one back
                raise
            shutil.rmtree(aside, ignore_errors=True)
            continue                            # another writer swapped in between: retry
        shutil.rmtree(aside, ignore_errors=True)
        return
    raise ArtifactError(f"{path}: could not swap the new artifact in after {attempts} attempts "
                        "(other compiles keep replacing it)")


def _write_contents(model: CompiledModel, tmp: Path, progress, embed_source: bool) -> None:
    """Every file of the artifact, written into the (empty) directory ``tmp``."""
    (tmp / "kernels").mkdir(parents=True)
    natives = [k for ks in model.kernels.values() for k in ks if k.func]
    functions: dict = {}                  # identical kernels share one function (codegen.sharing)
    for k in natives:
        functions.setdefault(k.func, k)
    for func, k in functions.items():
        (tmp / "kernels" / f"{func}.c").write_text(k.source)
    objects = _build_objects(list(functions.values()), progress)
    host = _host_program(model)
    if host is not None and objects:
        (tmp / "kernels" / f"{HOST_NAME}.c").write_text(host.source)
        objects.append(build_object(host.source, HOST_NAME))
    if objects:
        link_library(objects, tmp / "kernels.so")
    blobs = BlobWriter()
    weights = _weight_sources(natives, blobs)
    replace = {id(k.packed): None for k in natives if id(k) in weights}
    state = {"plan": model.plan, "kernels": model.kernels, "target": model.target.to_json(),
             "source_model": model.source_model, "dims": list(model.dims)}
    graph = model.plan.graph
    stripped = {name: graph.values[name].const for name in prepacked_only_constants(model) + unread_constants(model)}
    try:    # constants only GEMM kernels read (as their prepacked weight), or nothing reads, are not written
        for name in stripped:
            graph.values[name].const = None
        doc = plain_data.dump(state, blobs, replace)
    finally:
        for name, const in stripped.items():
            graph.values[name].const = const
    # where each kernel's prepacked weight comes from: raw weight packed at load, or stored packed
    enc_index = doc.pop("_ids", None)
    doc["packed_weights"] = [{"kernel": enc_index[id(k)], **weights[id(k)]} for k in natives if id(k) in weights]
    doc["blobs"] = blobs.index
    blobs.write(tmp / "weights.bin")
    (tmp / "plan.json").write_text(json.dumps(doc, separators=(",", ":"), allow_nan=False))
    if embed_source:
        _copy_source_model(model.source_model, tmp / "model")
    manifest = manifest_of(model)
    manifest["embedded_source"] = bool(embed_source and (tmp / "model").is_dir())
    if host is not None and objects:
        manifest["host"] = {"sha256": sha256_text(host.source), "steps": len(host.steps),
                            "native_steps": sum(st.native for st in host.steps)}
    manifest["weights_bytes"] = blobs.size
    manifest["files"] = {str(p.relative_to(tmp)): file_sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest["digest"] = manifest_digest(manifest)
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))


def _weight_sources(kernels, blobs: BlobWriter) -> dict[int, dict]:
    """id(kernel) -> ``{"raw": blob}`` (packed at load from the raw weight) or ``{"packed": blob}``.
    The raw form is used only where packing the raw weight reproduces the kernel's panels exactly;
    blobs are content addressed, so a weight shared by layers (ALBERT) or equal to a graph constant
    is stored once."""
    out = {}
    for k in kernels:
        if k.packed is None:
            continue
        raw_of, pack, _ = PACKERS.get(k.family, (None, None, None))
        raw = raw_of(k) if raw_of else None
        if raw is not None and _same_bits(pack(k, raw), k.packed):
            out[id(k)] = {"raw": blobs.add(np.ascontiguousarray(raw))}
        else:
            out[id(k)] = {"packed": blobs.add(k.packed)}
    return out


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays hold the same type, shape and bytes: an int8 kernel's packed quads are
    bytes in a float32 array, where some words read as NaN (never equal as floats)."""
    return a.dtype == b.dtype and a.shape == b.shape and \
        np.array_equal(np.ascontiguousarray(a).view(np.uint8), np.ascontiguousarray(b).view(np.uint8))


def manifest_digest(manifest: dict) -> str:
    """sha256 over the manifest (its canonical JSON, less the digest field) — which holds the
    sha256 of every other file: one value that changes when anything in the artifact does."""
    body = {k: v for k, v in manifest.items() if k != "digest"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def prepacked_only_constants(model: CompiledModel) -> list[str]:
    """Graph constants that only GEMM kernels read, each as its prepacked weight: the plan on disk
    leaves them out (``weights.npz`` has them in the layout the kernels stream)."""
    readers: dict[str, list[str]] = {}
    for g in model.plan.groups:
        for name in g.inputs:
            readers.setdefault(name, []).append(g.name)
    out = []
    for name, groups in readers.items():
        v = model.plan.graph.values[name]
        if v.const is None or name in model.plan.graph.outputs:
            continue
        if all(k.weight_name == name and k.packed is not None
               for g in groups for k in model.kernels[g]):
            out.append(name)
    return out


def unread_constants(model: CompiledModel) -> list[str]:
    """Graph constants no group reads (initializers that constant folding or horizontal fusion
    replaced: BERT's separate Q/K/V weights once concatenated) — not written to the artifact."""
    read = {name for g in model.plan.groups for name in g.inputs} | set(model.plan.graph.outputs)
    return [name for name, v in model.plan.graph.values.items() if v.const is not None and name not in read]


def _copy_source_model(source: str, dest: Path) -> None:
    """The ONNX model (and its external data files) travels with the artifact: the runtime's
    out-of-range path re-imports it."""
    import onnx

    src = Path(source) if source else None
    if src is None or not src.is_file():
        return
    dest.mkdir()
    shutil.copy2(src, dest / src.name)
    proto = onnx.load(str(src), load_external_data=False)
    locations = set()
    for t in proto.graph.initializer:
        for entry in t.external_data:
            if entry.key == "location":
                locations.add(entry.value)
    for loc in locations:
        shutil.copy2(src.parent / loc, dest / loc)


def _host_program(model: CompiledModel):
    """The model's host program (linked into ``kernels.so``; the runtime regenerates it at load
    and uses the linked one when the two sources agree), or None when it cannot be generated."""
    from tscomp.runtime.host_program import program_for

    try:
        return program_for(model)
    except Exception as exc:    # noqa: BLE001 - the artifact stays valid: the runtime calls groups from Python
        warnings.warn(f"no host program for this artifact ({type(exc).__name__}: {exc}); its groups will be "
                      f"called from Python", RuntimeWarning, stacklevel=2)
        return None


def _build_objects(kernels, progress) -> list[Path]:
    """Object files of every kernel (cached: normally compiled already while compiling the model),
    built concurrently — the compiler runs as a subprocess, so threads suffice."""
    from concurrent.futures import ThreadPoolExecutor

    from tscomp.compiler import default_threads

    with ThreadPoolExecutor(max_workers=default_threads()) as pool:
        futures = [pool.submit(build_object, k.source, k.func) for k in kernels]
        objects = []
        for n, (k, f) in enumerate(zip(kernels, futures)):
            objects.append(f.result())
            if progress:
                progress(n + 1, len(kernels), k.func)
    return objects


REQUIRED_FILES = ("plan.json", "weights.bin")


def read_manifest(path: str | Path, *, expected_digest: str | None = None) -> dict:
    """The manifest, checked: format and version, then its digest (over the manifest itself, which
    lists every file's sha256), and ``expected_digest`` when given. Nothing else is read."""
    path = Path(path)
    if not path.is_dir():
        raise ArtifactError(f"{path}: no such artifact directory (compile one with 'tscomp compile')")
    mf = path / "manifest.json"
    if not mf.is_file():
        raise ArtifactError(f"{path}: not a tscomp artifact (no manifest.json)")
    try:
        manifest = json.loads(mf.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{mf}: corrupt manifest ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{mf}: not a tscomp artifact manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format version {version}, this tscomp reads version "
                            f"{FORMAT_VERSION}; recompile the model with this tscomp")
    digest = manifest.get("digest")
    if digest != manifest_digest(manifest):
        raise ArtifactError(f"{mf}: the manifest was modified after compilation (its digest does not match "
                            f"its contents); recompile the model")
    if expected_digest is not None and digest != expected_digest:
        raise ArtifactError(f"{path}: artifact digest {digest} is not the expected {expected_digest}")
    return manifest


def verify_files(path: Path, manifest: dict, *, skip: tuple[str, ...] = ()) -> None:
    """Every file the manifest lists is there with its recorded sha256, every file the artifact
    needs is listed, and no file is there that the manifest does not list (``skip``: files the
    caller hashes while reading them)."""
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise ArtifactError(f"{path}: manifest.json lists no files")
    needed = list(REQUIRED_FILES) + (["kernels.so"] if _has_native_variants(manifest) else [])
    for rel in needed:
        if rel not in files:
            raise ArtifactError(f"{path}: {rel} is not listed in manifest.json (an edited or incomplete artifact)")
    present = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file() or p.is_symlink()}
    for rel in sorted(present - set(files) - {"manifest.json"}):
        raise ArtifactError(f"{path}: file {rel} is not listed in manifest.json (an edited artifact)")
    for rel, digest in files.items():
        f = path / rel
        if not f.is_file():
            raise ArtifactError(f"{path}: missing file {rel} (listed in manifest.json)")
        if rel in skip:
            continue
        if file_sha256(f) != digest:
            raise ArtifactError(f"{path}: file {rel} is corrupt or was modified (sha256 differs from manifest.json)")


def _has_native_variants(manifest: dict) -> bool:
    return any(v.get("func") for g in manifest.get("groups", []) for v in g.get("variants", []))


def _read_verified(path: Path, rel: str, manifest: dict, verify: bool) -> bytes:
    data = (path / rel).read_bytes()
    if verify and hashlib.sha256(data).hexdigest() != manifest["files"][rel]:
        raise ArtifactError(f"{path}: file {rel} is corrupt or was modified (sha256 differs from manifest.json)")
    return data


def load_artifact(path: str | Path, *, verify: bool = True,
                  expected_digest: str | None = None) -> tuple[CompiledModel, dict]:
    """Read an artifact: the manifest and its digest first, then every file's sha256 (the weights
    are hashed as they are read into memory), and only then the plan is decoded (plain data:
    nothing in it is executed) and the kernel library loaded."""
    path = Path(path)
    manifest = read_manifest(path, expected_digest=expected_digest)
    check_host_precision(path, manifest)
    if verify:
        verify_files(path, manifest, skip=("weights.bin", "plan.json"))
    else:
        for rel in REQUIRED_FILES:
            if not (path / rel).is_file():
                raise ArtifactError(f"{path}: missing file {rel}")
    plan_bytes = _read_verified(path, "plan.json", manifest, verify)
    buf, digest = read_aligned(path / "weights.bin")
    if verify and digest != manifest["files"]["weights.bin"]:
        raise ArtifactError(f"{path}: file weights.bin is corrupt or was modified (sha256 differs from manifest.json)")
    try:
        doc = json.loads(plan_bytes)
        blobs = BlobReader(buf, doc["blobs"])
        decoder = plain_data.Decoder(doc["objects"], blobs)
        state = plain_data.load(doc, blobs, decoder=decoder)
        packs = [(decoder.ref(int(e["kernel"])), e) for e in doc.get("packed_weights", [])]
    except (PlainDataError, json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(f"{path}: cannot read the compiled plan ({type(exc).__name__}: {exc}); "
                            f"recompile the model") from None
    _check_against_manifest(path, state, manifest)
    _attach_weights(packs, blobs)
    lib = load_library(path / "kernels.so") if (path / "kernels.so").exists() else None
    for ks in state["kernels"].values():
        for k in ks:
            if k.func is None:
                continue
            if lib is None:
                raise ArtifactError(f"{path}: kernels.so missing but kernel {k.func} needs it")
            k._bind_function(lib)
    model = CompiledModel(state["plan"], state["kernels"], Target.from_json(state["target"]),
                          source_model=state["source_model"], dims=state.get("dims", []))
    return model, manifest


def _attach_weights(packs, blobs: BlobReader) -> None:
    """Give each GEMM and Conv kernel its prepacked panels: packed at load from the one stored raw weight
    (kernels whose configurations pack alike share one copy; packing runs on a few threads), or
    the stored panels themselves."""
    from tscomp.compiler import default_threads
    from tscomp.runtime.packing import pack_all

    jobs: dict = {}
    for kernel, entry in packs:
        if "packed" in entry:
            kernel.packed = blobs.get(entry["packed"])   # its own aligned copy (a view would keep the file's buffer)
            continue
        key = _pack_key(kernel, entry)
        if key not in jobs:
            jobs[key] = (PACKERS[kernel.family][1], kernel, blobs.view(entry["raw"]))   # read while packing only
    packed = dict(zip(jobs, pack_all(list(jobs.values()), workers=default_threads())))
    for kernel, entry in packs:
        if "raw" in entry:
            kernel.packed = packed[_pack_key(kernel, entry)]


def _pack_key(kernel, entry) -> tuple:
    """Kernels whose panels are packed alike: same raw weight, family and layout (:data:`PACKERS`)."""
    return entry["raw"], kernel.family, PACKERS[kernel.family][2](kernel)


def _check_against_manifest(path: Path, state: dict, manifest: dict) -> None:
    """The plan's symbols, inputs and outputs are the ones the manifest states (the manifest is what
    users read and edit-checks cover)."""
    graph = state["plan"].graph
    want = [[s["name"], s["min"], s["max"]] for s in manifest.get("symbols", [])]
    have = [[i.name, i.min, i.max] for i in graph.symbols.live_symbols()]
    if want != have:
        raise ArtifactError(f"{path}: the plan's symbols {have} differ from manifest.json's {want}; recompile")
    if [i["name"] for i in manifest.get("inputs", [])] != list(graph.inputs) or \
            [o["name"] for o in manifest.get("outputs", [])] != list(graph.outputs):
        raise ArtifactError(f"{path}: the plan's inputs/outputs differ from manifest.json's; recompile")


__all__ = ["ArtifactError", "FORMAT_VERSION", "check_host_precision", "file_sha256", "load_artifact", "manifest_digest", "read_manifest",
           "write_artifact"]
