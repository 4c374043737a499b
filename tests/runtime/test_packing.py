"""Weights packed at load: the documented panel layout for any shape and block tile, on a few threads."""
from __future__ import annotations

import numpy as np
import pytest

from tscomp.codegen.cpu_gemm import prepack_weights
from tscomp.codegen.tile_config import TileConfig
from tscomp.runtime.packing import pack_all


@pytest.mark.parametrize("K,N", [(1, 1), (7, 13), (64, 48), (97, 131), (128, 384), (300, 17)])
@pytest.mark.parametrize("kc,nc,nr", [(64, 32, 16), (256, 384, 16), (48, 64, 8), (1000, 1024, 32)])
def test_packed_panels_are_nr_columns_over_all_of_k_with_zero_padding(K, N, kc, nc, nr):
    cfg = TileConfig(mr=4, nr=nr, mc=48, nc=nc, kc=kc)
    W = np.random.default_rng(K * N).standard_normal((K, N)).astype(np.float32)
    got = prepack_weights(W, cfg)
    assert got.ctypes.data % 64 == 0
    npad = -(-N // nr) * nr
    padded = np.zeros((K, npad), np.float32)
    padded[:, :N] = W
    np.testing.assert_array_equal(got, padded.reshape(K, npad // nr, nr).transpose(1, 0, 2).reshape(-1))


def test_pack_all_keeps_order():
    assert pack_all([(lambda x: x * 2, k) for k in range(5)], workers=2) == [0, 2, 4, 6, 8]
