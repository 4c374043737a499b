"""One SIMT body, two dialects: the CUDA and OpenCL sources of a kernel differ only by prelude."""
from __future__ import annotations

import pytest

from tscomp.codegen.cpu_gemm import Epilogue
from tscomp.codegen.simt.config import SimtTile
from tscomp.codegen.simt.dialect import BODY_MARK, CUDA_PRELUDE, OPENCL_PRELUDE, body_of, hoist_statics, prelude_of
from tscomp.codegen.simt.gemm import SimtEpilogue, gemm_body
from tscomp.codegen.simt.program import SimtProgram

TILE = SimtTile(64, 64, 16, 32, 32, 4, 8, async_copy=True)


def _program():
    body = gemm_body("k", TILE, 97, 13, SimtEpilogue.from_cpu(Epilogue.bias_gelu()))
    return SimtProgram("/* header: group g, tile t */\n", body, {"TS_WANT_ASYNC": 1})


def test_cuda_and_opencl_sources_share_the_body_and_differ_only_by_prelude():
    p = _program()
    cu, cl = p.cuda, p.opencl
    assert cu != cl
    assert body_of(cu) == body_of(cl) == p.body
    assert cu.startswith(p.header) and cl.startswith(p.header)
    pre_cu, pre_cl = prelude_of(cu), prelude_of(cl)
    assert CUDA_PRELUDE in pre_cu and OPENCL_PRELUDE in pre_cl
    # removing each dialect's prelude leaves the same text
    assert pre_cu.replace(CUDA_PRELUDE, "") == pre_cl.replace(OPENCL_PRELUDE, "")


def test_body_uses_only_the_vocabulary_no_dialect_words():
    body = _program().body
    for word in ("__global__", "__shared__", "__syncthreads", "blockIdx", "threadIdx", "__kernel", "__local",
                 "barrier(", "get_group_id", "get_local_id", "#pragma omp"):
        assert word not in body, word
    for word in ("TS_KERNEL", "TS_SHARED", "TS_BARRIER()", "TS_BLOCK(0)", "TS_THREAD(0)", "TS_GLOBAL"):
        assert word in body, word


@pytest.mark.parametrize("prelude,words", [
    (CUDA_PRELUDE, ("__global__", "__shared__", "__syncthreads()", "blockIdx", "threadIdx")),
    (OPENCL_PRELUDE, ("__kernel", "__local", "barrier(CLK_LOCAL_MEM_FENCE)", "get_group_id", "get_local_id")),
])
def test_each_prelude_maps_indices_shared_memory_and_barriers(prelude, words):
    for w in words:
        assert w in prelude


def test_the_async_staging_path_is_a_macro_in_the_one_body():
    body = _program().body
    assert "#if TS_ASYNC_COPY" in body and "TS_COPY_ASYNC(" in body and "#else" in body
    assert "#define TS_ASYNC_COPY 0" in OPENCL_PRELUDE
    assert "__CUDA_ARCH__ >= 800" in CUDA_PRELUDE and "__pipeline_memcpy_async" in CUDA_PRELUDE


def test_constant_tables_are_hoisted_to_file_scope_constants():
    tables, rest = hoist_statics(["static const float k0[3] = {1.0f, 2.0f, 3.0f};  /* w */", "const float t0 = 1;"])
    assert tables == ["TS_CONSTANT float k0[3] = {1.0f, 2.0f, 3.0f};  /* w */"]
    assert rest == ["const float t0 = 1;"]


def test_body_of_refuses_text_without_the_mark():
    with pytest.raises(ValueError, match="body mark"):
        body_of("int x;")
    assert BODY_MARK.startswith("/*")
