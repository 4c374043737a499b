"""Pooling as reductions (placeholder while being written)."""
from tscomp.errors import UnsupportedOperatorError


class PoolAnalysis:
    def __init__(self, plan, group):
        raise UnsupportedOperatorError(f"group {group.name}: native pooling kernels are not implemented yet")


class CompiledPool:
    pass
