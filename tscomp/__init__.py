"""tscomp: an ahead-of-time compiler for dynamic-shape deep-learning models.

Stages (see DESIGN.md): graph/ (ONNX import, symbolic shapes, simplification,
reference execution) -> schedule/ -> codegen/ -> runtime/.
"""
from tscomp.errors import TscompError
from tscomp.graph import Graph, load_model
from tscomp.runtime import Runtime

__all__ = ["Graph", "Runtime", "TscompError", "load_model"]
__version__ = "0.1.0"
