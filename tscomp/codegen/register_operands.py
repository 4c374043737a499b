"""Which operand of a register tile's k step is held in a register (DESIGN.md "Targets", the CPU
micro-kernels; TSCompiler §4.2's register tile).

A register tile's k step loads ``vectors`` SIMD vectors of one operand and broadcasts ``rows``
scalars of the other, then issues ``rows x vectors`` multiply-adds. Written as C intrinsics, each
operand is a local the compiler may keep in a register or re-read from memory at every use. GCC
re-reads: where the tile leaves few registers free it folds the vector load into every FMA that
uses it (``vfmadd231ps 32(%rax), %ymm3, %ymm9``), so an AVX2 4x24 tile issues 12 vector loads
and 4 broadcasts per k step instead of 3 + 4: 16 loads against 12 FMAs is more than the two
256-bit loads a Zen 3 or a Skylake core issues per cycle, and the FMA pipes wait. Measured on a
Zen 3 (AVX2, 2 threads): a 1x1 Conv 2048 -> 512 channels at 7x7 positions, 24x4 row-vector tile,
98 -> 143 GFLOP/s with the weights held, outputs bit-identical.

The rule: hold the loaded vectors when the accumulators, the vectors and one broadcast fit the
register file; else hold the broadcasts (all rows', with one loaded vector at a time) when the
accumulators, the broadcasts and one vector fit; else leave the choice to the compiler. An operand
is held by an empty ``asm`` that claims to rewrite its register: the compiler must then materialize
the value in a register once and cannot fold its load into the instructions that read it.
"""
from __future__ import annotations

#: SIMD registers per ISA (the scalar fallback's bound only keeps the unrolled C reasonable)
VECTOR_REGISTERS = {"avx512": 32, "avx2": 16, "scalar": 16}

#: what :func:`held_operand` returns
VECTORS, BROADCASTS = "vectors", "broadcasts"


def held_operand(isa: str, accumulators: int, vectors: int, rows: int) -> str | None:
    """:data:`VECTORS`, :data:`BROADCASTS` or None (neither fits: the compiler decides) for a k step
    of ``vectors`` loaded vectors times ``rows`` broadcasts into ``accumulators`` registers."""
    registers = VECTOR_REGISTERS.get(isa)
    if registers is None or isa == "scalar":
        return None
    if accumulators + vectors + 1 <= registers:
        return VECTORS
    if accumulators + rows + 1 <= registers:
        return BROADCASTS
    return None


def hold(name: str) -> str:
    """The C statement that keeps ``name`` (a SIMD local) in a register from here on."""
    return f'__asm__("" : "+v"({name}));'
