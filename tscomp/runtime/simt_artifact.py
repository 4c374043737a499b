"""The CUDA target's artifact (``tscomp compile --target cuda``) and its runner on a SIMT device
(TSCompiler §6: the runtime loader; DESIGN.md "model.tsc/": .cubin / .ptx / sources).

Layout::

    model.tsc/
      manifest.json              format, archs, inputs/outputs, per group its variants: family,
                                 entry point, tile configuration, ptxas resources per architecture
                                 (registers, shared bytes, spills), the schedule stage's provenance
                                 (method analytic/single, measured: false, with the model's
                                 prediction per variant; or measured-gpu with the times per sample
                                 shape) and the group's ranking; the
                                 Schedules summary; sha256 of every file and a digest over it all
      plan.json + weights.bin    the Plan and the kernel objects as plain data (no pickle)
      kernels/model.<sm_XY>.cubin  one cubin per architecture (every kernel of the model)
      kernels/model.<compute_XY>.ptx  PTX for forward compatibility
      kernels/model.cu           the CUDA translation unit; kernels/<func>.cl each OpenCL rendering

:func:`load_cuda_artifact` verifies every file's sha256 and returns a :class:`CudaArtifactRunner`;
``device="opencl"`` runs the OpenCL renderings, ``device="cuda"`` loads the cubin of the GPU's
architecture (NVIDIA's cuda-bindings; a one-line error without a GPU).
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Mapping

import numpy as np

from tscomp.errors import TscompError
from tscomp.runtime import plain_data
from tscomp.runtime.plain_data import BlobReader, BlobWriter, read_aligned

FORMAT = "tscomp-cuda-artifact"
FORMAT_VERSION = 1


class CudaArtifactError(TscompError):
    """A CUDA artifact that cannot be loaded (missing file, wrong format, corrupt)."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _variant_entry(k, sched=None, variant=None) -> dict:
    """One kernel variant; ``sched``/``variant``: its group's GroupSchedule and ScheduledVariant
    (provenance: method analytic/single, unmeasured; the analytic model's prediction)."""
    e = {"family": k.family, "target": k.target, "func": k.func}
    if k.target == "cuda":
        cfg = getattr(k, "cfg", None)
        if cfg is not None:
            e["tile_config"] = cfg.to_json()
            e["tile_config_text"] = cfg.describe()
        e["resources"] = {arch: {name: r.to_json() for name, r in res.items()} for arch, res in k.ptxas.items()}
        e["launch"] = {kk: v for kk, v in k.resources().items() if kk in ("threads", "shared_bytes")}
        e["schedule"] = {"method": sched.method if sched is not None else "heuristic",
                         "measured": bool(sched is not None and sched.measured)}
        if variant is not None and variant.model is not None:
            e["schedule"]["model"] = {kk: v for kk, v in variant.to_json().items() if kk not in ("config", "measured")}
        if variant is not None and variant.timings is not None:   # timed on a GPU at compile time
            e["schedule"]["measured_ms"] = dict(variant.timings)
        if k.family == "simt-gemm":
            e["paths"] = ["plain", "cp.async double-buffered (sm_80+)"] if cfg.async_copy else ["plain"]
    else:
        e["reasons"] = list(k.reasons)
    return e


def _group_entry(model, g: str, vs: list) -> dict:
    schedules = getattr(model, "schedules", None)
    sched = schedules.groups.get(g) if schedules is not None else None
    variants = sched.variants if sched is not None and len(sched.variants) == len(vs) else [None] * len(vs)
    out = {"name": g, "variants": [_variant_entry(k, sched, v) for k, v in zip(vs, variants)]}
    if sched is not None:
        out["schedule"] = sched.provenance()
    if g in model.ranking:
        out["analytic_ranking"] = model.ranking[g]
    return out


def write_cuda_artifact(model, path) -> Path:
    """Write a :class:`~tscomp.codegen.simt.compile.CudaCompiled` to ``path`` (replaced atomically)."""
    path = Path(path)
    graph = model.plan.graph
    tmp = Path(tempfile.mkdtemp(prefix=".tsc-cuda-", dir=path.parent if path.parent.exists() else None))
    files: dict[str, bytes] = {}
    for arch, b in model.builds.items():
        files[f"kernels/model.{arch}.cubin"] = b.cubin
    files[f"kernels/model.compute_{model.ptx_arch.split('_')[1]}.ptx"] = model.ptx.encode()
    files["kernels/model.cu"] = model.source.encode()
    for variants in model.kernels.values():
        for k in variants:
            if k.target == "cuda":
                files[f"kernels/{k.func}.cl"] = k.program.opencl.encode()
    blobs = BlobWriter()
    doc = plain_data.dump({"plan": model.plan, "kernels": model.kernels}, blobs)
    doc.pop("_ids", None)
    doc["_blobs"] = blobs.index
    files["plan.json"] = json.dumps(doc).encode()
    for rel, data in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
    blobs.write(tmp / "weights.bin")
    shas = {rel: _sha(d) for rel, d in files.items()}
    shas["weights.bin"] = _sha((tmp / "weights.bin").read_bytes())
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "target": "cuda", "archs": list(model.archs),
        "dims": list(model.dims),
        "inputs": [{"name": n, "dtype": str(np.dtype(graph.values[n].dtype)),
                    "shape": [str(d) for d in graph.values[n].shape]} for n in graph.inputs],
        "outputs": [{"name": n, "shape": [str(d) for d in graph.values[n].shape]} for n in graph.outputs],
        "groups": [_group_entry(model, g, vs) for g, vs in model.kernels.items()],
        "notes": list(model.notes), "compile_seconds": round(model.compile_seconds, 2), "files": shas,
    }
    if getattr(model, "schedules", None) is not None:
        manifest["schedules"] = model.schedules.to_json()
    manifest["digest"] = _sha(json.dumps(manifest, sort_keys=True).encode())
    (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def is_cuda_artifact(path) -> bool:
    """Whether ``path`` holds a CUDA-target artifact (by its manifest's format; nothing verified)."""
    try:
        return json.loads((Path(path) / "manifest.json").read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def read_cuda_manifest(path) -> dict:
    path = Path(path)
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise CudaArtifactError(f"{path}: no readable manifest.json ({exc})") from None
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise CudaArtifactError(f"{path}: not a {FORMAT} v{FORMAT_VERSION} artifact")
    digest = manifest.pop("digest", None)
    if digest != _sha(json.dumps(manifest, sort_keys=True).encode()):
        raise CudaArtifactError(f"{path}: manifest digest mismatch (edited or corrupt)")
    manifest["digest"] = digest
    for rel, sha in manifest["files"].items():
        f = path / rel
        if not f.is_file() or _sha(f.read_bytes()) != sha:
            raise CudaArtifactError(f"{path}: {rel} missing or its sha256 differs from the manifest")
    return manifest


class CudaArtifactRunner:
    """Runs a CUDA artifact on ``device`` ("opencl" | "cuda"; None: ``$TSCOMP_SIMT_DEVICE``, else opencl)."""

    def __init__(self, path, device: str | None = None):
        from tscomp.codegen.simt.families import SimtPlanRunner
        from tscomp.runtime.device_opencl import default_device_name
        device = default_device_name() if device is None else device
        self.path = Path(path)
        self.manifest = read_cuda_manifest(self.path)
        buf, _ = read_aligned(self.path / "weights.bin")
        doc = json.loads((self.path / "plan.json").read_text())
        state = plain_data.load(doc, BlobReader(buf, doc.get("_blobs", {})))
        self.plan, kernels = state["plan"], state["kernels"]
        if device == "cuda":   # pragma: no cover - needs a GPU
            from tscomp.codegen.nvcc import default_arch_of_device
            from tscomp.runtime.device_opencl import device as get_device
            get_device("cuda")
            arch = default_arch_of_device()
            cubin = self.path / f"kernels/model.{arch}.cubin"
            if not cubin.exists():
                raise CudaArtifactError(f"{self.path}: no cubin for this GPU's {arch} (built: "
                                        f"{', '.join(self.manifest['archs'])}); recompile with --arch {arch}")
            data = cubin.read_bytes()
            for vs in kernels.values():
                for k in vs:
                    if k.target == "cuda":
                        k.cubin = data
        self.runner = SimtPlanRunner(self.plan, kernels, device=device)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.run(inputs)


def load_cuda_artifact(path, device: str | None = None) -> CudaArtifactRunner:
    return CudaArtifactRunner(path, device)


__all__ = ["CudaArtifactError", "CudaArtifactRunner", "is_cuda_artifact", "load_cuda_artifact", "read_cuda_manifest",
           "write_cuda_artifact"]
