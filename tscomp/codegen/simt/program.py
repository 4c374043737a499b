"""A SIMT program: header + one dialect-neutral body, rendered per dialect (:mod:`.dialect`), run on
a SIMT device (:mod:`tscomp.runtime.device_opencl`) from :class:`~.launch.Launch` lists."""
from __future__ import annotations

from dataclasses import dataclass, field

from tscomp.codegen.simt.dialect import CUDA, DIALECTS, OPENCL


@dataclass(frozen=True)
class SimtProgram:
    header: str                     # a C comment: group, fused ops, tile configuration
    body: str                       # the dialect-neutral text (kernels, constant tables)
    defines: dict = field(default_factory=dict, hash=False, compare=False)   # configuration macros

    def source(self, dialect: str = "cuda") -> str:
        return DIALECTS[dialect].render(self.header, self.body, self.defines)

    @property
    def cuda(self) -> str:
        return CUDA.render(self.header, self.body, self.defines)

    @property
    def opencl(self) -> str:
        return OPENCL.render(self.header, self.body, self.defines)

    def code_for(self, device: str, cubin: bytes | None = None):
        """What ``device`` loads: this program's OpenCL source, or ``cubin`` (the artifact's, for the
        GPU's architecture) / an nvcc build of its CUDA source for the GPU's architecture."""
        if device == "opencl":
            return self.opencl
        if cubin is None:   # pragma: no cover - needs a GPU
            from tscomp.codegen.nvcc import compile_cubin, default_arch_of_device
            cubin = compile_cubin(self.cuda, default_arch_of_device()).cubin
        return cubin

    def run_in(self, session, launches, device: str, cubin: bytes | None = None) -> None:
        """Launch inside a device session (allocations shared with the session's other launches)."""
        session.run(self.code_for(device, cubin), launches)

    def run(self, launches, device: str | None = None, cubin: bytes | None = None) -> str:
        """Launch on ``device``: OpenCL builds this program's OpenCL rendering; CUDA loads ``cubin``
        (the artifact's, for this device's architecture) or builds this program with nvcc.
        ``device`` None: :func:`~tscomp.runtime.device_opencl.default_device_name`. Returns the
        name of the device it ran on."""
        from tscomp.runtime.device_opencl import default_device_name, device as get_device
        device = default_device_name() if device is None else device
        get_device(device).run_launches(self.code_for(device, cubin), launches)
        return device


class SessionRun:
    """A SIMT executor defined by ``_launches(env, binding)`` -> (launches, output Buffers):
    ``launches`` gives the outputs as host arrays, ``run`` launches on ``self.device`` and returns
    them, ``run_in`` launches inside a plan run's device session and leaves them on the device. An
    empty output launches nothing."""

    def launches(self, env, binding):
        launches, outputs = self._launches(env, binding)
        return launches, {n: b.array for n, b in outputs.items()}

    def run(self, env, binding):
        launches, outputs = self._launches(env, binding)
        if any(b.array.size for b in outputs.values()):
            self.program.run(launches, self.device, getattr(self, "cubin", None))
        return {n: b.array for n, b in outputs.items()}

    def __call__(self, env, binding):
        return self.run(env, binding)

    def run_in(self, session, env, binding) -> dict:
        from tscomp.codegen.simt.launch import device_array
        launches, outputs = self._launches(env, binding)
        if any(b.array.size for b in outputs.values()):
            self.program.run_in(session, launches, session.device.name, getattr(self, "cubin", None))
        return {n: device_array(b) for n, b in outputs.items()}


def header_comment(lines: list[str]) -> str:
    return "/*\n" + "\n".join(" * " + line.replace("*/", "* /") for line in lines) + "\n */\n"


__all__ = ["SessionRun", "SimtProgram", "header_comment"]
