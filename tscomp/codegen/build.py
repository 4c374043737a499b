"""Building generated C into shared libraries, with a compile cache.

Sources are compiled with the system C compiler (``$CC``, default ``cc``) as
``-O3 -march=native -fopenmp -shared -fPIC``; the library lands in a cache
directory keyed by a hash of the source and the flags, so an unchanged kernel is
never compiled twice. A compile error raises :class:`BuildError` naming the
source file kept on disk and the compiler's first error lines.

:func:`host_isa` says which SIMD level the host (and so ``-march=native``)
gives: ``"avx512"``, ``"avx2"`` or ``"scalar"`` — detected from the compiler's
predefined macros, never assumed.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tscomp.errors import TscompError

BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-Wall",
              "-Wno-unused-function", "-Wno-unused-variable")


class BuildError(TscompError):
    """The C compiler rejected a generated source (a tscomp bug: the source is kept)."""


def compiler() -> str:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise BuildError(f"C compiler {cc!r} not found (set $CC); tscomp's CPU target needs one")
    return cc


def cache_dir() -> Path:
    root = Path(os.environ.get("TSCOMP_CACHE", Path.home() / ".cache" / "tscomp")) / "kernels"
    root.mkdir(parents=True, exist_ok=True)
    return root


@functools.lru_cache(maxsize=None)
def host_isa() -> str:
    """The widest SIMD level ``-march=native`` enables here."""
    out = subprocess.run([compiler(), "-march=native", "-dM", "-E", "-x", "c", os.devnull],
                         capture_output=True, text=True, check=True).stdout
    if "__AVX512F__" in out:
        return "avx512"
    if "__AVX2__" in out and "__FMA__" in out:
        return "avx2"
    return "scalar"


def build_library(source: str, name: str, *, extra_flags: tuple[str, ...] = (),
                  out_dir: Path | None = None) -> Path:
    """Compile ``source`` (C) into a shared library; return its path (cached by content)."""
    flags = BASE_FLAGS + tuple(extra_flags)
    digest = hashlib.sha256((source + "\0" + " ".join(flags) + "\0" + compiler()).encode()).hexdigest()[:20]
    out_dir = out_dir or cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"{name}-{digest}.so"
    if lib.exists():
        return lib
    src = out_dir / f"{name}-{digest}.c"
    src.write_text(source)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    result = subprocess.run([compiler(), *flags, str(src), "-o", tmp, "-lm"], capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        first = "; ".join(line for line in result.stderr.splitlines() if "error" in line)[:500]
        raise BuildError(f"compiling {src} failed: {first or result.stderr.strip()[:500]}")
    os.replace(tmp, lib)  # atomic: concurrent builders of the same source agree
    return lib


def load_library(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))
