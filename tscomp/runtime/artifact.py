"""The artifact: a compiled model on disk (``model.tsc/``), written by ``tscomp compile`` and read
by the :class:`~tscomp.runtime.Runtime` (TSCompiler §6: the runtime loader's input).

Layout::

    model.tsc/
      manifest.json     format version; symbols with ranges and constraints; inputs/outputs with
                        symbolic shapes and dtypes; groups with their kernel variants (family,
                        target, tile config, resource use, measured single-wave time); sha256 of
                        every other file
      kernels.so        every generated kernel linked into one shared library
      kernels/*.c       their sources (what a person reads to debug a kernel)
      weights.npz       the prepacked weight panels, by kernel entry point
      plan.pkl          the Plan and the kernel objects (how to call each entry point), pickled

Loading checks the format version first, then that every file the manifest lists is present with
the recorded hash, and only then unpickles (``plan.pkl`` is code-bearing like any pickle: load
artifacts you trust, as with ``torch.load``).
"""
from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import pickle
import shutil
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from tscomp.codegen.build import build_object, link_library, load_library
from tscomp.codegen.cpu_gemm import aligned_copy
from tscomp.compiler import CompiledModel
from tscomp.errors import TscompError
from tscomp.graph.symbols import shape_str
from tscomp.schedule.target import Target

FORMAT = "tscomp-artifact"
FORMAT_VERSION = 2     # 2: the target as data, per-variant schedule provenance


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
        entry["samples"] = [{"size": z, "tasks": t, "us": round(sec * 1e6, 3)} for z, t, sec in kernel.samples]
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


def write_artifact(model: CompiledModel, path: str | Path, *, progress=None) -> Path:
    """Write ``model`` to the directory ``path``, atomically: everything is written into a unique
    temporary directory beside ``path`` and swapped in by rename only once complete, so a failed
    or interrupted write (an exception, Ctrl-C) leaves the previous artifact as it was and no
    temporary directory behind, and concurrent writers to one path end with one complete
    artifact (the last to swap). ``path`` may only replace an existing tscomp artifact."""
    path = Path(path)
    if path.exists() and not (path / "manifest.json").exists():
        raise ArtifactError(f"{path} exists and is not a tscomp artifact; not overwriting it")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=path.name + ".tmp-"))
    try:
        os.chmod(tmp, 0o777 & ~_umask())       # mkdtemp makes it private; an artifact is not
        _write_contents(model, tmp, progress)
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


def _write_contents(model: CompiledModel, tmp: Path, progress) -> None:
    """Every file of the artifact, written into the (empty) directory ``tmp``."""
    (tmp / "kernels").mkdir(parents=True)
    natives = [k for ks in model.kernels.values() for k in ks if k.func]
    for k in natives:
        (tmp / "kernels" / f"{k.func}.c").write_text(k.source)
    objects = _build_objects(natives, progress)
    if objects:
        link_library(objects, tmp / "kernels.so")
    weights = _packed_weights(natives)
    np.savez(tmp / "weights.npz", **{key: arr for key, arr in weights.values()})
    saved = {k.func: k.packed for k in natives if k.func in weights}
    stripped = {name: model.plan.graph.values[name].const for name in prepacked_only_constants(model)}
    try:
        for name in stripped:
            model.plan.graph.values[name].const = None
        for k in natives:
            if k.func in weights:
                k.packed = None
                k.packed_key = weights[k.func][0]
        with open(tmp / "plan.pkl", "wb") as f:
            pickle.dump({"plan": model.plan, "kernels": model.kernels, "target": model.target.to_json(),
                         "source_model": model.source_model,
                         "dims": list(model.dims)}, f, protocol=5)
    finally:
        for k in natives:
            if k.func in saved:
                k.packed = saved[k.func]
        for name, const in stripped.items():
            model.plan.graph.values[name].const = const
    _copy_source_model(model.source_model, tmp / "model")
    manifest = manifest_of(model)
    manifest["files"] = {str(p.relative_to(tmp)): file_sha256(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))


def _packed_weights(kernels) -> dict[str, tuple[str, np.ndarray]]:
    """kernel entry -> (npz key, packed panels), identical panel sets stored once: ALBERT's shared
    layers, and variants whose tile configs pack alike, point at one array."""
    by_digest: dict[str, str] = {}
    out = {}
    for k in kernels:
        arr = k.packed
        if arr is None:
            continue
        digest = hashlib.sha256(np.ascontiguousarray(arr).view(np.uint8)).hexdigest()[:24]
        key = by_digest.setdefault(digest, f"w{len(by_digest)}_{digest}")
        out[k.func] = (key, arr)
    return out


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


def read_manifest(path: str | Path) -> dict:
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
    if manifest.get("format") != FORMAT:
        raise ArtifactError(f"{mf}: not a tscomp artifact manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ArtifactError(f"{path}: artifact format version {version}, this tscomp reads version "
                            f"{FORMAT_VERSION}; recompile the model with this tscomp")
    return manifest


def verify_files(path: Path, manifest: dict) -> None:
    for rel, digest in manifest.get("files", {}).items():
        f = path / rel
        if not f.is_file():
            raise ArtifactError(f"{path}: missing file {rel} (listed in manifest.json)")
        if file_sha256(f) != digest:
            raise ArtifactError(f"{path}: file {rel} is corrupt or was modified (sha256 differs from manifest.json)")


def load_artifact(path: str | Path, *, verify: bool = True) -> tuple[CompiledModel, dict]:
    path = Path(path)
    manifest = read_manifest(path)
    if verify:
        verify_files(path, manifest)
    try:
        with open(path / "plan.pkl", "rb") as f:
            state = pickle.load(f)
        weights = dict(np.load(path / "weights.npz"))
    except Exception as exc:  # a truncated pickle raises anything from EOFError to ValueError
        raise ArtifactError(f"{path}: cannot read the compiled plan ({type(exc).__name__}: {exc})") from None
    lib = load_library(path / "kernels.so") if (path / "kernels.so").exists() else None
    packed: dict[str, np.ndarray] = {}
    for ks in state["kernels"].values():
        for k in ks:
            if k.func is None:
                continue
            key = k.packed_key
            if key is not None:
                if key not in packed:    # one aligned copy per distinct panel set, shared by its kernels
                    packed[key] = aligned_copy(weights[key])   # npz members load at any alignment
                k.packed = packed[key]
            if lib is None:
                raise ArtifactError(f"{path}: kernels.so missing but kernel {k.func} needs it")
            k._bind_function(lib)
    model = CompiledModel(state["plan"], state["kernels"], Target.from_json(state["target"]),
                          source_model=state["source_model"], dims=state.get("dims", []))
    return model, manifest


__all__ = ["ArtifactError", "FORMAT_VERSION", "file_sha256", "load_artifact", "read_manifest", "write_artifact"]
