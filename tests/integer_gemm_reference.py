"""The quantized tests' onnxruntime session: each operator as specified (onnxruntime's fusions
change the fp32 rounding), on exact integer GEMMs (:mod:`tscomp.exact_integer_reference`: where
this CPU's onnxruntime sums uint8 x int8 products through a saturating int16, the session runs the
model with those GEMMs as uint8 x uint8 ones of the same result)."""
from __future__ import annotations

from pathlib import Path

import onnx
import onnxruntime as ort

from tscomp.exact_integer_reference import onnxruntime_source


def plain_session(model: onnx.ModelProto | str | Path) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(onnxruntime_source(model), opts, providers=["CPUExecutionProvider"])
