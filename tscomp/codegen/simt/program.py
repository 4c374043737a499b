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

    def run(self, launches, device: str | None = None, cubin: bytes | None = None) -> str:
        """Launch on ``device``: OpenCL builds this program's OpenCL rendering; CUDA loads ``cubin``
        (the artifact's, for this device's architecture) or builds this program with nvcc.
        ``device`` None: :func:`~tscomp.runtime.device_opencl.default_device_name`. Returns the
        name of the device it ran on."""
        from tscomp.runtime.device_opencl import default_device_name, device as get_device
        device = default_device_name() if device is None else device
        dev = get_device(device)
        if device == "opencl":
            dev.run_launches(self.opencl, launches)
        else:   # pragma: no cover - needs a GPU
            if cubin is None:
                from tscomp.codegen.nvcc import compile_cubin, default_arch_of_device
                cubin = compile_cubin(self.cuda, default_arch_of_device()).cubin
            dev.run_launches(cubin, launches)
        return device


def header_comment(lines: list[str]) -> str:
    return "/*\n" + "\n".join(" * " + line.replace("*/", "* /") for line in lines) + "\n */\n"


__all__ = ["SimtProgram", "header_comment"]
