"""One SIMT kernel text, two dialects: CUDA C and OpenCL C (DESIGN.md "Dialect"; TSCompiler §5.1's
GPU hierarchy: grid of blocks, warps, threads).

Every SIMT body is written once in a small vocabulary of macros; a *prelude* per dialect maps it to
the language (the way tinygrad's C-style renderer keeps one renderer with per-language fields):

=====================  ==============================  ==================================
vocabulary             CUDA                            OpenCL C
=====================  ==============================  ==================================
``TS_KERNEL``          ``extern "C" __global__``       ``__kernel``
``TS_LAUNCH_BOUNDS(n)`` ``__launch_bounds__(n)``        (nothing)
                       (ptxas keeps n threads
                       launchable: registers capped)
``TS_ALIGN16``         ``__align__(16)``               (nothing: vload4/vstore4 need 4)
``TS_COPY4(d, s)``     one 16-byte load and store      ``vstore4(vload4(0, s), 0, d)``
``TS_ZERO4(d)``        one 16-byte zero store          ``vstore4((float4)(0.0f), 0, d)``
``TS_COPY_ASYNC16``    16-byte ``cp.async`` (sm_80+)   (the plain path is compiled)
``TS_GLOBAL``          (nothing)                       ``__global``
``TS_SHARED``          ``__shared__``                  ``__local``
``TS_CONSTANT``        ``__device__ const``            ``__constant``
``TS_DEVICE``          ``static __device__ inline``    ``static inline``
``TS_RESTRICT``        ``__restrict__``                ``restrict``
``TS_BARRIER()``       ``__syncthreads()``             ``barrier(CLK_LOCAL_MEM_FENCE)``
``TS_BARRIER_GLOBAL()`` ``__syncthreads()``            ``barrier(CLK_GLOBAL_MEM_FENCE |
                       (orders the block's global      CLK_LOCAL_MEM_FENCE)``
                       writes too)
``TS_BLOCK(d)``        ``blockIdx.{x,y,z}``            ``get_group_id(d)``
``TS_THREAD(d)``       ``threadIdx.{x,y,z}``           ``get_local_id(d)``
``TS_NBLOCKS(d)``      ``gridDim.{x,y,z}``             ``get_num_groups(d)``
``TS_NTHREADS(d)``     ``blockDim.{x,y,z}``            ``get_local_size(d)``
``TS_ASYNC_COPY``      1 on sm_80+ when the config     0 (the plain staging path)
                       asks for it, else 0
``TS_MMA``             1 on sm_80+ when the config     0 (the SIMT inner product)
                       asks for tensor cores, else 0
``expf`` … ``fmaf``    CUDA's own                      the overloaded ``exp`` … ``fma``
``int64_t`` …          ``<stdint.h>``                  typedefs of ``long`` …
=====================  ==============================  ==================================

plus the index helpers of the CPU C (``ts_floordiv``, ``ts_mod``, ``ts_min``, ``ts_max``,
``ts_index`` with an error record in global memory) and the C generator's math helper names
(``ts_expf``, ``ts_sigmoidf``, ``tscomp_erff``) mapped to the dialect's own functions, so the fused expression IR's C
statements (:mod:`tscomp.codegen.c_expr`, the registry's ``c_expr`` templates) drop into a body
unchanged. A rendered source is ``header + prelude + BODY_MARK + body``: the CUDA and the OpenCL
source of a kernel differ only in the prelude (tested).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

#: the line that separates a rendered source's prelude from its dialect-neutral body
BODY_MARK = "/* ==== tscomp SIMT body (dialect-neutral; everything above is the dialect prelude) ==== */\n"

_COMMON = r"""
/* index helpers of the fused expression IR (int64_t; as the CPU C prelude) */
TS_DEVICE int64_t ts_floordiv(int64_t a, int64_t b)
{ int64_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
TS_DEVICE int64_t ts_mod(int64_t a, int64_t b)
{ int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
TS_DEVICE int64_t ts_min(int64_t a, int64_t b) { return a < b ? a : b; }
TS_DEVICE int64_t ts_max(int64_t a, int64_t b) { return a > b ? a : b; }
/* a division by a constant (the CPU C's FMA-corrected product, codegen.c_expr.QUOTIENT_HELPER):
   the device's own correctly rounded division */
#define ts_quotient(x, s, r) ((x) / (s))
/* a data-dependent index checked against [0, extent) (negative counts from the end); the first
   failing thread records (check + 1, value, position, extent) in the kernel's error record and the
   lookup reads element 0 instead (ts_index_fail alone: a count checked against [0, limit]) */
TS_DEVICE void ts_index_fail(TS_GLOBAL int64_t* err, int64_t check, int64_t value, int64_t pos, int64_t extent)
{
    if (TS_CAS64(err, check + 1)) { err[1] = value; err[2] = pos; err[3] = extent; }
}
TS_DEVICE int64_t ts_index(int64_t v, int64_t extent, int64_t check, int64_t pos, TS_GLOBAL int64_t* err)
{
    const int64_t g = v < 0 ? v + extent : v;
    if (g < 0 || g >= extent) { ts_index_fail(err, check, v, pos, extent); return 0; }
    return g;
}
"""

CUDA_PRELUDE = r"""/* ---- CUDA prelude ---- */
#include <stdint.h>
#include <math.h>
#include <cuda_fp16.h>
/* float16 tensors (a float16 model's inputs and outputs, only ever cast to and from float): the CPU
   kernels' element type _Float16, which nvcc does not take, is CUDA's __half */
#define _Float16 __half
#define TS_KERNEL extern "C" __global__
#define TS_LAUNCH_BOUNDS(n) __launch_bounds__(n)
#define TS_ALIGN16 __align__(16)
/* four consecutive floats, 16-byte aligned at both ends (the caller guarantees it) */
#define TS_COPY4(dst, src) (*(float4*)(dst) = *(const float4*)(src))
#define TS_ZERO4(dst) (*(float4*)(dst) = make_float4(0.0f, 0.0f, 0.0f, 0.0f))
#define TS_GLOBAL
#define TS_SHARED __shared__
#define TS_CONSTANT __device__ const
#define TS_DEVICE static __device__ __forceinline__
#define TS_RESTRICT __restrict__
#define TS_BARRIER() __syncthreads()
#define TS_BARRIER_GLOBAL() __syncthreads()
#define TS_DIM_0 x
#define TS_DIM_1 y
#define TS_DIM_2 z
#define TS_CAT_(a, b) a##b
#define TS_CAT(a, b) TS_CAT_(a, b)
#define TS_BLOCK(d) ((int64_t)blockIdx.TS_CAT(TS_DIM_, d))
#define TS_THREAD(d) ((int64_t)threadIdx.TS_CAT(TS_DIM_, d))
#define TS_NBLOCKS(d) ((int64_t)gridDim.TS_CAT(TS_DIM_, d))
#define TS_NTHREADS(d) ((int64_t)blockDim.TS_CAT(TS_DIM_, d))
#define ts_expf(x) expf(x)
#define ts_sigmoidf(x) (1.0f / (1.0f + expf(-(x))))
#define tscomp_erff(x) erff(x)
#define TS_CAS64(p, v) (atomicCAS((unsigned long long*)(p), 0ULL, (unsigned long long)(v)) == 0ULL)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && defined(TS_WANT_ASYNC) && TS_WANT_ASYNC
#include <cuda_pipeline.h>
#define TS_ASYNC_COPY 1
/* 4-byte global->shared copy of *src (an address inside the tensor even when not ``ok``);
   zero-filled, nothing read, when ``ok`` is false (local padding, DietCode 4.1) */
#define TS_COPY_ASYNC(dst, src, ok) __pipeline_memcpy_async((dst), (src), 4, (ok) ? 0 : 4)
/* the same for four consecutive floats, 16-byte aligned at both ends */
#define TS_COPY_ASYNC16(dst, src, ok) __pipeline_memcpy_async((dst), (src), 16, (ok) ? 0 : 16)
#define TS_COPY_COMMIT() __pipeline_commit()
#define TS_COPY_WAIT(n) __pipeline_wait_prior(n)
#else
#define TS_ASYNC_COPY 0
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800 && defined(TS_WANT_MMA) && TS_WANT_MMA
#include <mma.h>
#define TS_MMA 1     /* tensor-core inner product: wmma m16n16k8, TF32 inputs, fp32 accumulators */
#else
#define TS_MMA 0
#endif
"""

OPENCL_PRELUDE = r"""/* ---- OpenCL C prelude ---- */
#pragma OPENCL EXTENSION cl_khr_fp64 : enable
/* float16 tensors (only ever cast to and from float): the CPU kernels' _Float16 is OpenCL's half,
   which a device without cl_khr_fp16 cannot load or store this way (its kernels then fail to build) */
#ifdef cl_khr_fp16
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
#define _Float16 half
#pragma OPENCL EXTENSION cl_khr_int64_base_atomics : enable
typedef long int64_t;
typedef ulong uint64_t;
typedef int int32_t;
typedef uint uint32_t;
typedef short int16_t;
typedef ushort uint16_t;
typedef char int8_t;
typedef uchar uint8_t;
#define INT64_C(v) v##L
#define UINT64_C(v) v##UL
#define INT64_MAX LONG_MAX
#define INT64_MIN LONG_MIN
#define UINT64_MAX ULONG_MAX
#define TS_KERNEL __kernel
#define TS_LAUNCH_BOUNDS(n)
#define TS_ALIGN16
#define TS_COPY4(dst, src) vstore4(vload4(0, (src)), 0, (dst))
#define TS_ZERO4(dst) vstore4((float4)(0.0f), 0, (dst))
#define TS_GLOBAL __global
#define TS_SHARED __local
#define TS_CONSTANT __constant
#define TS_DEVICE static inline
#define TS_RESTRICT restrict
#define TS_BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
#define TS_BARRIER_GLOBAL() barrier(CLK_GLOBAL_MEM_FENCE | CLK_LOCAL_MEM_FENCE)
#define TS_BLOCK(d) ((int64_t)get_group_id(d))
#define TS_THREAD(d) ((int64_t)get_local_id(d))
#define TS_NBLOCKS(d) ((int64_t)get_num_groups(d))
#define TS_NTHREADS(d) ((int64_t)get_local_size(d))
#define TS_ASYNC_COPY 0
#define TS_MMA 0
#define TS_CAS64(p, v) (atom_cmpxchg((volatile TS_GLOBAL long*)(p), 0L, (long)(v)) == 0L)
/* the C math names the expression IR prints, as OpenCL's overloaded built-ins */
#define expf exp
#define exp2f exp2
#define expm1f expm1
#define logf log
#define log1pf log1p
#define log2f log2
#define sqrtf sqrt
#define tanhf tanh
#define erff erf
#define powf pow
#define fabsf fabs
#define floorf floor
#define ceilf ceil
#define nearbyintf rint
#define nearbyint rint
#define roundf round
#define truncf trunc
#define sinf sin
#define cosf cos
#define tanf tan
#define atanf atan
#define fmaxf fmax
#define fminf fmin
#define fmodf fmod
#define fmaf fma
#define ts_expf(x) exp(x)
#define ts_sigmoidf(x) (1.0f / (1.0f + exp(-(x))))
#define tscomp_erff(x) erf(x)
"""


@dataclass(frozen=True)
class Dialect:
    """One SIMT language: its name, the prelude that maps the vocabulary, and what a build calls it."""
    name: str              # "cuda" | "opencl"
    prelude: str
    suffix: str            # source file suffix

    def render(self, header: str, body: str, defines: dict[str, int] | None = None) -> str:
        """The full source: ``header`` (a comment), configuration ``defines``, prelude, body."""
        defs = "".join(f"#define {k} {int(v)}\n" for k, v in sorted((defines or {}).items()))
        return header + defs + self.prelude + _COMMON + BODY_MARK + body


CUDA = Dialect("cuda", CUDA_PRELUDE, ".cu")
OPENCL = Dialect("opencl", OPENCL_PRELUDE, ".cl")
DIALECTS = {d.name: d for d in (CUDA, OPENCL)}


def body_of(source: str) -> str:
    """The dialect-neutral body of a rendered source (what follows :data:`BODY_MARK`)."""
    if BODY_MARK not in source:
        raise ValueError("not a rendered SIMT source (no body mark)")
    return source.split(BODY_MARK, 1)[1]


def prelude_of(source: str) -> str:
    return source.split(BODY_MARK, 1)[0]


_STATIC = re.compile(r"^\s*static const (\w+) (\w+)\[(\d+)\] = (\{.*\});(.*)$")


def hoist_statics(lines: list[str]) -> tuple[list[str], list[str]]:
    """Split the expression IR's ``static const T name[n] = {...};`` constant tables (function-scope
    C) into file-scope ``TS_CONSTANT`` tables and the remaining statements."""
    tables, rest = [], []
    for line in lines:
        m = _STATIC.match(line)
        if m:
            tables.append(f"TS_CONSTANT {m.group(1)} {m.group(2)}[{m.group(3)}] = {m.group(4)};{m.group(5)}")
        else:
            rest.append(line)
    return tables, rest


__all__ = ["BODY_MARK", "CUDA", "CUDA_PRELUDE", "DIALECTS", "Dialect", "OPENCL", "OPENCL_PRELUDE", "body_of",
           "hoist_statics", "prelude_of"]
