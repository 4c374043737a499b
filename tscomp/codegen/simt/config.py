"""The SIMT tile configuration (TSCompiler §5.1, Fig. 4): block tile ⟨T_Mb, T_Nb, T_Kb⟩ staged in
shared memory, warp tile ⟨T_Mw, T_Nw⟩ (a warp's 32 threads cover it), thread register tile
⟨T_Mi, T_Ni⟩; ``async_copy`` asks for the sm_80+ ``cp.async`` double-buffered staging path
(§5.4), compiled where the architecture has it, the plain path elsewhere (and on OpenCL); ``mma``
asks for the tensor-core inner product (§5.4 tensorization: wmma m16n16k8 TF32 on sm_80+, i.e.
fp32 inputs rounded to a 10-bit mantissa, fp32 accumulation — about 1e-3 relative, so opt-in), with
the SIMT inner product as its plain path in the same source."""
from __future__ import annotations

from dataclasses import dataclass

from tscomp.errors import UnsupportedOperatorError

WARP = 32
#: shared-memory row padding of the (k-major, transposed while staging) A tile: 4 keeps its rows
#: 16-byte aligned, so the inner product reads a thread's T_Mi values as vector loads; the
#: transposed staging stores conflict more than with 1. Measured on an H200 over 96 GEMM
#: configurations x 4 M (benchmarks/results/cuda_gemm_kernel_ab_h200.json, "pad4" vs "new"): 2-6%
#: faster than 1 on average, and
#: 1 was up to 1.32x slower on 32x32 tiles once the W tile moved in float4 groups.
A_PAD = 4


@dataclass(frozen=True)
class SimtTile:
    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    tm: int
    tn: int
    async_copy: bool = False
    mma: bool = False

    @property
    def a_pad(self) -> int:
        """Padding of the A tile's rows (``A_PAD``; wmma needs 4 too: a 16-byte leading dimension)."""
        return 4 if self.mma else A_PAD

    def validate(self) -> "SimtTile":
        bad = []
        if any(v <= 0 for v in (self.bm, self.bn, self.bk, self.wm, self.wn, self.tm, self.tn)):
            bad.append("every extent must be positive")
        elif self.bm % self.wm or self.bn % self.wn:
            bad.append("the block tile must be a whole number of warp tiles")
        elif self.wm % self.tm or self.wn % self.tn:
            bad.append("the warp tile must be a whole number of thread tiles")
        elif (self.wm // self.tm) * (self.wn // self.tn) != WARP:
            bad.append(f"a warp tile must hold {WARP} thread tiles, not {(self.wm // self.tm) * (self.wn // self.tn)}")
        if not bad and self.mma and (self.wm % 16 or self.wn % 16 or self.bk % 8):
            bad.append("a tensor-core (wmma m16n16k8) tile needs warp tiles of multiples of 16 and T_Kb of 8")
        if bad:
            raise UnsupportedOperatorError(f"SIMT tile {self.describe()}: {bad[0]}")
        return self

    @property
    def warps(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn)

    @property
    def threads(self) -> int:
        return self.warps * WARP

    @property
    def stages(self) -> int:
        return 2 if self.async_copy else 1

    def shared_bytes(self) -> int:
        """Static shared memory of one block (A tile k-major with padding, B tile)."""
        return 4 * self.stages * self.bk * ((self.bm + self.a_pad) + self.bn) + (4 * 256 * self.warps if self.mma else 0)

    def accumulators(self) -> int:
        return self.tm * self.tn

    def describe(self) -> str:
        return (f"block <{self.bm}, {self.bn}, {self.bk}>, warp <{self.wm}, {self.wn}>, thread <{self.tm}, {self.tn}>, "
                f"{self.threads} threads, {'cp.async double-buffered' if self.async_copy else 'plain'} staging"
                + (", tensor cores (wmma TF32) on sm_80+" if self.mma else ""))

    def slug(self) -> str:
        return f"b{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}_t{self.tm}x{self.tn}" + ("_mma" if self.mma else "") + ("_async" if self.async_copy
                                                                                              else "")

    def to_json(self) -> dict:
        return {"bm": self.bm, "bn": self.bn, "bk": self.bk, "wm": self.wm, "wn": self.wn, "tm": self.tm,
                "tn": self.tn, "async_copy": self.async_copy, "mma": self.mma}

    @classmethod
    def from_json(cls, d) -> "SimtTile":
        return cls(**{k: d[k] for k in ("bm", "bn", "bk", "wm", "wn", "tm", "tn")},
                   async_copy=bool(d.get("async_copy", False)), mma=bool(d.get("mma", False)))


__all__ = ["A_PAD", "SimtTile", "WARP"]
