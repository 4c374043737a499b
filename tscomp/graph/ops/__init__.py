"""Operator registry entries, one module per family of operators.

Importing this package registers every operator; look them up with
:func:`tscomp.graph.ops.registry.lookup`.
"""
from tscomp.graph.ops import registry  # noqa: F401
from tscomp.graph.ops import elementwise  # noqa: F401  (registers on import)
from tscomp.graph.ops import tensor  # noqa: F401
from tscomp.graph.ops import nn  # noqa: F401
from tscomp.graph.ops import signal  # noqa: F401
from tscomp.graph.ops import recurrent  # noqa: F401
from tscomp.graph.ops import sampling  # noqa: F401
from tscomp.graph.ops import quantization  # noqa: F401
from tscomp.graph.ops import c_kernels  # noqa: F401  (attaches the index ops' C kernels)
from tscomp.graph.ops import signal_c  # noqa: F401  (attaches the DFT's C kernel)

from tscomp.graph.ops.registry import REGISTRY, FusionClass, OpDef, lookup

__all__ = ["REGISTRY", "FusionClass", "OpDef", "lookup"]
