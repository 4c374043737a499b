"""Real-model fixtures for tscomp: transformers families exported to dynamic-shape ONNX.

``models.families`` describes the families and draws inputs; ``models.export`` writes the ONNX files
(``python -m models.export --help``). Importing this package does not import torch or transformers.
"""

from models.families import FAMILIES, SIZES, build_model, get_family, make_inputs, symbol_ranges

__all__ = ["FAMILIES", "SIZES", "build_model", "get_family", "make_inputs", "symbol_ranges"]
