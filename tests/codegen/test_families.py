"""The kernel families' target decisions (tscomp.codegen.families)."""
import dataclasses
from types import SimpleNamespace

import pytest

from tscomp.codegen.families import gemm_target
from tscomp.schedule.target import CpuSpec, Target, cuda

SPEC = CpuSpec(cores=2, isa="avx512", vector_width=16, vector_registers=32, l1=32 << 10, l2=1 << 20, l3=32 << 20)


def cpu(**features) -> Target:
    return Target("cpu", "c", dataclasses.replace(SPEC, **features))


INT8_AND_BF16 = SimpleNamespace(int8_x_offset=-128, exact_in_bf16=True)     # a symmetric int8 weight
BF16_ONLY = SimpleNamespace(int8_x_offset=None, exact_in_bf16=True)         # a weight with zero points
FLOAT = SimpleNamespace(int8_x_offset=None, exact_in_bf16=False)


@pytest.mark.parametrize("features,analysis,want", [
    ({"vnni": True, "bf16": True}, INT8_AND_BF16, "int8"),
    ({"vnni": True, "bf16": True}, BF16_ONLY, "bf16"),
    ({"vnni": False, "bf16": True}, INT8_AND_BF16, "bf16"),
    ({"vnni": True, "bf16": False}, BF16_ONLY, "fp32"),
    ({"vnni": False, "bf16": False}, INT8_AND_BF16, "fp32"),
    ({"vnni": True, "bf16": True, "amx": True}, INT8_AND_BF16, "bf16"),     # AMX's bf16 tiles first
    ({"vnni": True, "bf16": True, "amx": True, "amx_int8": True}, INT8_AND_BF16, "int8"),   # ... unless they do int8
    ({"vnni": True, "bf16": True, "amx": True, "amx_int8": True}, BF16_ONLY, "bf16"),
    ({"vnni": True, "bf16": True}, FLOAT, "fp32"),
])
def test_integer_operand_gemms_take_int8_then_bf16_where_the_cpu_has_them(features, analysis, want):
    assert gemm_target(analysis, cpu(**features)).precision == want


def test_a_model_compiled_at_bf16_and_a_gpu_target_keep_their_precision():
    assert gemm_target(INT8_AND_BF16, cpu(vnni=True, bf16=True).with_precision("bf16")).precision == "bf16"
    assert gemm_target(INT8_AND_BF16, cuda("sm_80")).precision == "fp32"


def test_int8_gemms_run_on_amx_tiles_only_where_the_tiles_do_int8():
    int8 = SimpleNamespace(int8_x_offset=-128, exact_in_bf16=True)
    assert gemm_target(int8, cpu(vnni=True, bf16=True, amx=True, amx_int8=True)).gemm_isa == "amx"   # TDPBUSD
    assert gemm_target(int8, cpu(vnni=True, bf16=True)).gemm_isa == "avx512"                         # VPDPBUSD
    with_tiles = gemm_target(int8, cpu(vnni=True, bf16=True, amx=True, amx_int8=True))
    assert with_tiles.key() != gemm_target(int8, cpu(vnni=True, bf16=True)).key()    # tuning records kept apart


def test_int8_conv_column_tiles_run_on_amx_only_where_the_tiles_do_int8():
    from tscomp.codegen.families import conv_target, conv_tile_isa
    quantized = SimpleNamespace(int8_x_offset=-128)
    assert conv_tile_isa(conv_target(quantized, cpu(vnni=True, amx=True, amx_int8=True))) == "amx"      # TDPBUSD
    assert conv_tile_isa(conv_target(quantized, cpu(vnni=True, amx=True))) == "avx512"                  # VPDPBUSD
    assert conv_tile_isa(conv_target(SimpleNamespace(int8_x_offset=None), cpu(vnni=True, amx=True, amx_int8=True))) \
        == "avx512"                                                                                     # a float Conv


def test_the_int8_conv_space_on_amx_holds_only_whole_tile_configurations():
    from tscomp.schedule.conv_space import ConvSpace
    space = ConvSpace(64, 576, cpu(vnni=True, amx=True, amx_int8=True).with_precision("int8"))
    assert space.isa == "amx" and len(space) > 0 and space.initial()
    for point in space:
        cfg = space.config(point)
        assert cfg.vector_axis == 1 and cfg.mr % 16 == 0 and cfg.nr % 16 == 0 and (cfg.mr // 16) * (cfg.nr // 16) <= 4
