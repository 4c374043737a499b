"""GEMM, convolution, normalization, reduction and resampling operators."""
