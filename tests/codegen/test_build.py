"""Building generated C: cache by content, clear errors, ISA detection."""
import ctypes
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from tscomp.codegen.build import (BuildError, build_library, build_object, host_isa, link_library, load_library,
                                  sanitize_flags)

SOURCE = """
#include <stdint.h>
int64_t add_one(int64_t x) { return x + 1; }
"""


def test_build_loads_and_caches_by_content(tmp_path):
    lib = build_library(SOURCE, "t", out_dir=tmp_path)
    fn = load_library(lib).add_one
    fn.restype, fn.argtypes = ctypes.c_int64, [ctypes.c_int64]
    assert fn(41) == 42
    mtime = lib.stat().st_mtime_ns
    assert build_library(SOURCE, "t", out_dir=tmp_path) == lib and lib.stat().st_mtime_ns == mtime


def test_compile_error_names_the_kept_source(tmp_path):
    with pytest.raises(BuildError, match=r"compiling .*bad-.*\.c failed: .*error") as info:
        build_library("int f( { return 0; }", "bad", out_dir=tmp_path)
    kept = str(info.value).split("compiling ", 1)[1].split(" failed", 1)[0]
    assert pathlib.Path(kept).read_text() == "int f( { return 0; }"


def test_host_isa_is_detected_from_the_compiler():
    assert host_isa() in ("avx512", "avx2", "scalar")


def test_functions_start_on_a_cache_line_alone_and_linked_after_other_objects(tmp_path):
    # a kernel is timed from its own library and called from the artifact's linked kernels.so: its
    # code must sit at the same offsets modulo 64 bytes in both, wherever the objects before it end
    odd = "int pad_%d(int x) { return x * %d + 1; }\n"
    objects = [build_object("".join(odd % (i * 10 + j, j + 2) for j in range(i + 1)), f"pad{i}") for i in range(3)]
    target = build_object(SOURCE, "aligned")
    alone = load_library(build_library(SOURCE, "aligned", out_dir=tmp_path))
    linked = load_library(link_library([*objects, target], tmp_path / "linked.so"))
    for lib in (alone, linked):
        assert ctypes.cast(lib.add_one, ctypes.c_void_p).value % 64 == 0


@pytest.mark.skipif(host_isa() != "avx512", reason="the wide-vector rule applies to AVX-512 hosts only")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump to read the generated code")
@pytest.mark.skipif(bool(sanitize_flags()), reason="a sanitizer's instrumentation changes what the loop compiles to")
def test_plain_loops_vectorize_with_512_bit_registers_on_avx512_hosts():
    # the fused epilogues and elementwise kernels are plain `omp simd` loops: GCC's -march=native
    # alone keeps them at 256 bits on Intel AVX-512 cores
    loop = """
    void scale(float* restrict y, const float* restrict x, long n)
    {
        #pragma omp simd
        for (long i = 0; i < n; ++i) y[i] = x[i] * 2.0f + 1.0f;
    }
    """
    obj = build_object(loop, "wide_loop")
    code = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True, check=True).stdout
    assert "zmm" in code


@pytest.mark.skipif(shutil.which("nm") is None, reason="needs nm")
def test_a_sqrt_in_a_loop_is_the_instruction_not_a_libm_call(tmp_path):
    # with errno semantics GCC keeps sqrtf a call (to set errno) and the loop scalar
    src = """
#include <math.h>
#include <stdint.h>
void rsqrt_all(const float* restrict x, float* restrict y, int64_t n)
{
    #pragma omp simd
    for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / sqrtf(x[i] + 1e-5f);
}
"""
    lib = build_library(src, "rsqrt_all", out_dir=tmp_path)
    symbols = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True).stdout
    assert "sqrtf" not in symbols, symbols
    fn = load_library(lib).rsqrt_all
    fn.restype, fn.argtypes = None, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    x = np.float32([0.0, 1.0, 4.0, 100.0, -1.0, np.inf])
    y = np.empty_like(x)
    fn(x.ctypes.data, y.ctypes.data, x.size)
    with np.errstate(invalid="ignore"):
        want = 1 / np.sqrt(x + np.float32(1e-5))
    np.testing.assert_allclose(y[:4], want[:4], rtol=1e-6)
    assert np.isnan(y[4]) and y[5] == 0


@pytest.mark.skipif(host_isa() == "scalar", reason="needs a SIMD host")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump to read the generated code")
@pytest.mark.skipif(bool(sanitize_flags()), reason="a sanitizer's instrumentation changes what the loop compiles to")
def test_the_exp_helper_vectorizes_in_a_summing_loop_and_keeps_its_special_values(tmp_path):
    # the softmax's exponential-and-sum row: under GCC's default -ftrapping-math ts_expf's nested
    # selects stayed branches and the loop scalar (a packed float->int conversion is the 2^n step)
    from tscomp.codegen.c_expr import EXP_HELPER
    src = "#include <math.h>\n#include <stdint.h>\n" + EXP_HELPER + """
float exp_row(float* restrict s, float m, int64_t n)
{
    float sum = 0.0f;
    #pragma omp simd reduction(+:sum)
    for (int64_t c = 0; c < n; ++c) { const float p = ts_expf(s[c] - m); s[c] = p; sum += p; }
    return sum;
}
"""
    obj = build_object(src, "exp_row")
    code = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True, check=True).stdout
    assert "vcvttps2dq" in code or "vcvtps2dq" in code, "the exponential loop stayed scalar"
    fn = load_library(build_library(src, "exp_row", out_dir=tmp_path)).exp_row
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_void_p, ctypes.c_float, ctypes.c_int64]
    x = np.float32([0.0, -1.0, 2.5, -90.0, 100.0, -np.inf, np.inf, 1e-3] * 3)
    s = x.copy()
    total = fn(s.ctypes.data, 0.0, s.size)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64)).astype(np.float32)     # e^100 overflows to inf in fp32
    want[x < -87] = 0.0
    np.testing.assert_allclose(s[np.isfinite(want)], want[np.isfinite(want)], rtol=3e-7)
    assert np.all(np.isinf(s[x > 88.8])) and s[x == -np.inf].tolist() == [0.0] * 3 and np.isinf(total)
    nan = np.float32([np.nan] * 9)
    assert np.isnan(fn(nan.ctypes.data, 0.0, nan.size)) and np.isnan(nan).all()


def test_a_builder_compiles_its_own_copy_of_the_source_whatever_another_writes_meanwhile(monkeypatch):
    """Two processes compiling the same kernel at once (two test workers, two compiles of one model)
    each wrote the one cached .c file; a compiler read it while the other builder rewrote it, and an
    object without the kernel's symbol became the cache entry ("undefined symbol" at load, in a fresh
    clone's tests). Here the other builder's write is simulated -- the cached .c truncated while the
    compiler runs -- and the build still gives the kernel."""
    import uuid

    from tscomp.codegen import build

    name = f"race_{uuid.uuid4().hex[:8]}"
    source = f"#include <stdint.h>\nint64_t {name}(int64_t x) {{ return x + 7; }}\n"
    real = build._run_compiler

    def compiler_while_another_builder_writes(args, what, tmp):
        if str(what).endswith(".c"):
            pathlib.Path(what).write_text("")      # the other builder's write_text, truncating first
        real(args, what, tmp)

    monkeypatch.setattr(build, "_run_compiler", compiler_while_another_builder_writes)
    fn = getattr(load_library(build_library(source, name)), name)
    fn.restype, fn.argtypes = ctypes.c_int64, [ctypes.c_int64]
    assert fn(35) == 42
