"""Register tiles keep their reused operand in registers: the rule, and what the compiler emits."""
import re
import subprocess

import pytest

from tscomp.codegen.build import compiler
from tscomp.codegen.cpu_gemm import generate_gemm
from tscomp.codegen.register_operands import BROADCASTS, VECTORS, held_operand
from tscomp.codegen.tile_config import TileConfig


def test_vectors_are_held_where_they_fit_beside_the_accumulators():
    assert held_operand("avx2", accumulators=12, vectors=3, rows=4) == VECTORS       # 4x24: 12 + 3 + 1 = 16
    assert held_operand("avx2", accumulators=12, vectors=2, rows=6) == VECTORS       # 6x16
    assert held_operand("avx512", accumulators=24, vectors=3, rows=8) == VECTORS     # 8x48


def test_broadcasts_are_held_where_the_vectors_do_not_fit():
    # AVX2 3x32: 12 accumulators + 4 vectors + 1 broadcast = 17 > 16 registers; 12 + 3 + 1 fits
    assert held_operand("avx2", accumulators=12, vectors=4, rows=3) == BROADCASTS


def test_the_compiler_decides_where_neither_operand_fits_or_there_is_no_register_file():
    assert held_operand("avx2", accumulators=14, vectors=2, rows=7) is None           # 14 + 2 + 1 and 14 + 7 + 1
    assert held_operand("scalar", accumulators=4, vectors=1, rows=4) is None


def _fma_loops(asm: str) -> list[list[str]]:
    """The instruction lists of the assembly's loops that issue at least 12 ``vfmadd231ps``."""
    loops, current = [], []
    for line in asm.splitlines():
        if re.match(r"\.L\d+:", line):
            current = []
            loops.append(current)
        elif line.startswith("\t"):
            current.append(line.strip())
    return [body for body in loops if sum(i.startswith("vfmadd231ps") for i in body) >= 12]


@pytest.mark.parametrize("tile", [(4, 24), (3, 32), (6, 16)])
def test_no_avx2_fma_of_a_full_tile_reads_its_operand_from_memory(tile, tmp_path):
    # GCC folded the weight loads of register-tight AVX2 tiles into every FMA (16 loads a k step
    # for a 4x24 tile instead of 7); held operands leave every FMA a register-register operation
    mr, nr = tile
    source = tmp_path / "k.c"
    source.write_text(generate_gemm(TileConfig(mr, nr, 4 * mr * 3, 4 * nr, 128), 512, 4 * nr, "avx2", name="k"))
    asm = tmp_path / "k.s"
    subprocess.run([compiler(), "-O3", "-mavx2", "-mfma", "-fopenmp", "-std=c11", "-S", str(source), "-o", str(asm)],
                   check=True, capture_output=True)
    loops = _fma_loops(asm.read_text())
    assert loops, "no full-tile FMA loop found in the assembly"
    folded = [i for body in loops for i in body if re.match(r"vfmadd231ps\s+-?\d*\(", i)]
    assert not folded, f"FMAs with a memory operand: {folded[:4]}"


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_winograd_tiles_leave_room_to_hold_an_operand(isa, monkeypatch):
    import tscomp.codegen.cpu_conv_winograd as winograd
    from tscomp.codegen.tile_config import VECTOR_WIDTH
    monkeypatch.setattr(winograd, "winograd_applies", lambda analysis: True)
    analysis = type("Analysis", (), {"OC": 256, "Cg": 256})()
    (cfg,) = winograd.winograd_configs(isa, analysis)
    vectors = cfg.mr // VECTOR_WIDTH[isa]
    assert held_operand(isa, cfg.nr * vectors, vectors, cfg.nr) is not None
    assert cfg.nr == (6 if isa == "avx2" else 8)     # AVX2: 2 x 7 tiles held neither operand
