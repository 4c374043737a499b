"""The one comparison the kernel-family tests share: a compiled Runtime against onnxruntime on
the same ONNX file, every output, shape and values (fp32: rtol = atol = 1e-4)."""
from __future__ import annotations

import numpy as np
import onnxruntime as ort


def assert_matches_onnxruntime(rt, model_path, feeds) -> None:
    """``feeds``: ``(label, {input: array})`` pairs; each runs on both, every output compared."""
    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for label, feed in feeds:
        want = dict(zip(names, sess.run(None, feed)))
        got = rt.run(feed)
        for name in names:
            assert got[name].shape == want[name].shape, (name, label)
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-4, err_msg=f"{name} at {label}")
