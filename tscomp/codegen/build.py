"""Building generated C into shared libraries, with a compile cache.

Sources are compiled with the system C compiler (``$CC``, default ``cc``) as
``-O3 -march=native -fopenmp -shared -fPIC -falign-functions=64`` (and, on AVX-512 hosts,
``-mprefer-vector-width=512``: :func:`vector_width_flags`); the library lands in a cache
directory keyed by a hash of the source and the flags, so an unchanged kernel is
never compiled twice. A compile error raises :class:`BuildError` naming the
source file kept on disk and the compiler's first error lines.

:func:`host_isa` says which SIMD level the host (and so ``-march=native``)
gives: ``"avx512"``, ``"avx2"`` or ``"scalar"`` — detected from the compiler's
predefined macros, never assumed.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tscomp.errors import TscompError

#: ``-falign-functions=64``: every function starts on a cache line, so its code sits at the same
#: offsets modulo 64 bytes in the per-kernel library the compiler times it from and in the artifact's
#: linked ``kernels.so`` the runtime calls. Without it a function lands wherever the objects before
#: it end, and a µs-scale kernel's time moved with that: BERT-base's fused attention at L=2 took
#: 14.2 µs in its own library and 17.4 µs in ``kernels.so`` (same process, same data), so the
#: dispatch table, built from the former, picked the variant that was slower in the latter. With
#: the alignment the two agree to 1% (13.7 / 13.6 µs).
#:
#: ``-fno-math-errno``: no generated kernel reads ``errno``, and with it GCC keeps ``sqrtf`` a libm call
#: (to set errno for a negative argument), so a loop with a Sqrt (or Pow(x, 0.5)) did not vectorize;
#: without it ``sqrtf`` is the ``vsqrtps`` instruction, exact as before. (It does not make libm's
#: other functions vectorize: those need glibc's ``-ffast-math`` declarations, and tscomp's kernels
#: call their own vectorizable expf, tanhf and erff instead.)
#:
#: ``-fno-trapping-math``: no generated kernel enables floating-point traps or reads the exception
#: flags, and with the default ``-ftrapping-math`` GCC may not execute a comparison that the source
#: only reaches conditionally (it could raise FE_INVALID on a NaN), so the helpers' nested selects
#: (``ts_expf``'s ``x != x ? x : (x < -87 ? 0 : (x > 88.7 ? inf : y))``) stayed branches and the loop
#: calling them stayed scalar -- "control flow in loop". Results are unchanged (no reassociation, no
#: contraction beyond ``fmaf``, NaN and infinities as before); only which loops vectorize changes.
#: Measured on an AVX2 Zen 3 host: tiny BERT's attention at L = 262, whose softmax exponentials ran
#: scalar, 800 -> 395 us.
BASE_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c11", "-Wall",
              "-Wno-unused-function", "-Wno-unused-variable", "-falign-functions=64", "-fno-math-errno",
              "-fno-trapping-math")

#: ``TSCOMP_SANITIZE=address`` builds every kernel with AddressSanitizer (``make test-asan``);
#: the flags are part of the cache key, so sanitized and plain objects never mix
SANITIZERS = {"address": ("-fsanitize=address", "-fno-omit-frame-pointer")}


#: part of every cache key: raised when entries written before a fix may be wrong. 2: objects cached
#: before each builder compiled its own copy of the source (c4bd148) may lack their kernel's symbol
#: (two builders of one kernel, one compiler reading the .c mid-rewrite), and the loader takes an
#: existing entry as it is
CACHE_LAYOUT = 2


def vector_width_flags() -> tuple[str, ...]:
    """``-mprefer-vector-width=512`` where the host has AVX-512. GCC's ``-march=native`` on
    Intel AVX-512 cores vectorizes plain loops (the fused epilogues and row passes after a GEMM
    tile, the elementwise, reduction and attention kernels) with 256-bit vectors only; the
    GEMM micro-kernels use 512-bit intrinsics anyway, so the wider loops cost no clock speed.
    Measured on an Intel Xeon guest (AVX-512, AMX): GPT-2's tanh-GELU epilogue 0.58 -> 0.44 ns per
    element; whole models 0.98-0.99x the time (BERT-base, GPT-2-base, ViT-base)."""
    return ("-mprefer-vector-width=512",) if host_isa() == "avx512" else ()


def sanitize_flags() -> tuple[str, ...]:
    """Extra compile and link flags the ``TSCOMP_SANITIZE`` environment variable asks for."""
    name = os.environ.get("TSCOMP_SANITIZE", "").strip()
    if not name:
        return ()
    if name not in SANITIZERS:
        raise BuildError(f"TSCOMP_SANITIZE={name!r}: expected one of {', '.join(sorted(SANITIZERS))}")
    return SANITIZERS[name]


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
    """Compile ``source`` (C) into a shared library; return its path (cached by content). The object
    file is kept too, so linking an artifact's library later compiles nothing again."""
    obj = build_object(source, name, extra_flags=extra_flags)
    out_dir = out_dir or cache_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    lib = out_dir / f"{obj.stem}.so"
    if lib.exists():
        return lib
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
    os.close(fd)
    _run_compiler(["-shared", "-fopenmp", *sanitize_flags(), str(obj), "-o", tmp], lib, tmp)
    os.replace(tmp, lib)  # atomic: concurrent builders of the same source agree
    return lib


def build_object(source: str, name: str, *, extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile ``source`` into a position-independent object file (cached by content), for
    :func:`link_library` to put many kernels into one shared library."""
    flags = (*(f for f in BASE_FLAGS if f != "-shared"), *vector_width_flags(), *extra_flags, *sanitize_flags())
    key = "\0".join((source, " ".join(flags), compiler(), str(CACHE_LAYOUT)))
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    out_dir = cache_dir()
    obj = out_dir / f"{name}-{digest}.o"
    if obj.exists():
        return obj
    src = out_dir / f"{name}-{digest}.c"
    # each builder compiles its own complete copy of the source: concurrent builders of one kernel
    # (two test workers, two compiles) writing one .c had a compiler read it half-rewritten, and an
    # object without the kernel's symbol took the cache entry
    fd, tmp_src = tempfile.mkstemp(suffix=".c", prefix=f"{name}-", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    fd, tmp = tempfile.mkstemp(suffix=".o", dir=out_dir)
    os.close(fd)
    try:
        _run_compiler([*flags, "-c", tmp_src, "-o", tmp], src, tmp)
    except BuildError:
        os.replace(tmp_src, src)     # kept where the error names it
        raise
    os.replace(tmp_src, src)         # the source beside its object, for reading
    os.replace(tmp, obj)
    return obj


def link_library(objects: list[Path], out: Path) -> Path:
    """Link object files from :func:`build_object` into the shared library ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    _run_compiler(["-shared", "-fopenmp", *sanitize_flags(), *map(str, objects), "-o", tmp], out, tmp)
    os.replace(tmp, out)
    return out


def _run_compiler(args: list[str], what: Path, tmp: str) -> None:
    result = subprocess.run([compiler(), *args, "-lm"], capture_output=True, text=True)
    if result.returncode != 0:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        first = "; ".join(line for line in result.stderr.splitlines() if "error" in line or "multiple" in line)[:500]
        raise BuildError(f"compiling {what} failed: {first or result.stderr.strip()[:500]}")


def load_library(path: Path) -> ctypes.CDLL:
    return ctypes.CDLL(str(path))


@functools.lru_cache(maxsize=None)
def _openmp_runtime() -> ctypes.CDLL:
    # the kernels link the compiler's OpenMP runtime dynamically, so setting the thread count in
    # that library (one instance per process) applies to every loaded kernel
    probe = build_library("#include <omp.h>\n"
                          "int tscomp_omp_max_threads(void) { return omp_get_max_threads(); }\n"
                          "int tscomp_omp_use_threads(int n)\n"
                          "{\n    if (omp_get_max_threads() == n) return 0;\n"
                          "    omp_set_num_threads(n);\n    return 1;\n}\n",
                          "tscomp_omp_probe")
    lib = load_library(probe)
    lib.tscomp_omp_use_threads.argtypes, lib.tscomp_omp_use_threads.restype = [ctypes.c_int], ctypes.c_int
    lib.tscomp_omp_max_threads.restype = ctypes.c_int
    return lib


def use_threads_address() -> int:
    """Where ``tscomp_omp_use_threads(n)`` is (sets the calling thread's OpenMP thread count when it
    differs), for native callers: the request path sets the count through it, as this module does."""
    return ctypes.cast(_openmp_runtime().tscomp_omp_use_threads, ctypes.c_void_p).value


def set_num_threads(n: int) -> None:
    """Thread count of the OpenMP kernels this thread calls (an OpenMP setting of the calling thread,
    changed only when it differs: the setting itself is the record, so the native request path,
    which sets it in C, and this function never disagree about it)."""
    if n < 1:
        raise ValueError(f"num_threads must be >= 1, got {n}")
    _openmp_runtime().tscomp_omp_use_threads(int(n))


def get_num_threads() -> int:
    return int(_openmp_runtime().tscomp_omp_max_threads())
