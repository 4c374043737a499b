"""Where a host program's machine code comes from: the artifact's ``kernels.so`` when the compiler
linked the same host program into it (the manifest's ``host`` entry holds its source's SHA-256),
else a library built from the generated source (cached by content, like every kernel)."""
from __future__ import annotations

from pathlib import Path

from tscomp.codegen.build import build_library, load_library
from tscomp.codegen.native import sha256_text

#: the host program's object name in the kernel cache and the artifact
HOST_NAME = "tscomp_host"


def host_library(program, artifact: Path | None, manifest: dict):
    """A loaded library exporting ``program``'s entry points."""
    host = (manifest or {}).get("host") or {}
    if artifact is not None and host.get("sha256") == sha256_text(program.source):
        return load_library(Path(artifact) / "kernels.so")
    return load_library(build_library(program.source, HOST_NAME))


__all__ = ["HOST_NAME", "host_library"]
