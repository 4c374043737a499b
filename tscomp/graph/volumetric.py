"""3-D convolutions and pools rewritten onto the 2-D kernels (part of :func:`tscomp.graph.simplify.simplify`).

The Conv and pool families compile 1-D and 2-D operators; a video or volumetric model (ViViT's
tubelet embedding, 3-D ResNets, 3-D U-Nets) ran every 3-D Conv and pool on the numpy fallback.
Each is rewritten here as 2-D operators the families already tune, with views around them, so a
new spatial rank needs no new kernel:

* **Conv** ``[N, C, T, H, W] * [OC, C/g, kd, kh, kw]``: the ``kd`` temporal taps are unfolded into
  channels -- ``X'[n, t, c, j, h, w] = Xpad[n, c, t * sd + j * dd, h, w]`` (one strided Slice per
  tap, stacked by a Concat) -- and ``X'`` viewed as ``[N * To, C * kd, H, W]`` is convolved by the
  weight viewed as ``[OC, C/g * kd, kh, kw]``: the same multiply-adds, in one 2-D Conv (channel
  ``c * kd + j`` keeps every group's channels contiguous, so grouped and depthwise Convs stay so).
  The result ``[N * To, OC, Ho, Wo]`` is viewed back and transposed to ``[N, OC, To, Ho, Wo]``.
  The unfolded input is ``kd / sd`` times the input: the price of reusing the 2-D kernels (an
  implicit-GEMM gather over three axes would avoid it).
* **ConvTranspose** whose temporal stride equals its temporal kernel (no temporal padding,
  dilation or output padding: the 2x up-convolutions of 3-D U-Nets): every input frame scatters
  into ``kd`` output frames of its own, so it is one 2-D ConvTranspose of the frames
  ``[N * T, C, H, W]`` with ``OC * kd`` output channels (the weight ``[C, OC/g, kd, kh, kw]`` viewed
  as ``[C, OC/g * kd, kh, kw]``, the bias repeated ``kd`` times), whose channels ``(oc, j)`` are
  then moved to frame ``t * kd + j``.
* **MaxPool / AveragePool** over a box are separable: the 2-D pool over (H, W) of every frame
  (``[N * C * T, 1, H, W]``), then a ``kd x 1`` pool over T of ``[N, C, T, Ho * Wo]``. Per-axis
  padding, strides, dilations and ``ceil_mode`` carry over; an average's divisor is the product of
  its per-axis counts with or without ``count_include_pad``, so the mean of means is exact.
* **GlobalAveragePool / GlobalMaxPool** of rank 5 and more: the 2-D global pool of ``[N, C, T * H
  * W, 1]``.

Explicit and VALID padding are rewritten, and SAME where the temporal stride is 1 (its temporal pad
is then a constant; the 2-D operator keeps SAME for height and width). A SAME pad of a strided
temporal axis depends on T and keeps its node, as does a SAME ConvTranspose; the families say why
they refuse it.
"""
from __future__ import annotations

import numpy as np
import sympy

from tscomp.graph.ir import Graph, Node
from tscomp.graph.ops.nn import Window
from tscomp.graph.rewrite import NodeRewrite, replace_nodes

INT64_MAX = np.iinfo(np.int64).max
POOLS = ("MaxPool", "AveragePool")
GLOBAL_POOLS = ("GlobalAveragePool", "GlobalMaxPool")


def volumetric_as_planar(graph: Graph) -> int:
    """Rewrite every rank-5 Conv and ConvTranspose (constant weight), MaxPool / AveragePool and rank >= 5 global pool
    onto 2-D operators; returns how many."""
    return replace_nodes(graph, lambda g, node: _planar(g, node) if not node.domain else None)


def _planar(graph: Graph, node: Node) -> list[Node] | None:
    x = graph.values[node.inputs[0]] if node.inputs else None
    if x is None or x.shape is None or graph.values[node.outputs[0]].shape is None:
        return None
    if node.op_type in GLOBAL_POOLS and len(x.shape) >= 5:
        return _Planar(graph, node).global_pool()
    if len(x.shape) != 5 or graph.opset_of(node) < 11:      # Slice and Pad read their inputs since 11
        return None
    if node.op_type in ("Conv", "ConvTranspose"):
        w = graph.values[node.inputs[1]]
        if w.const is None or len(node.outputs) != 1:
            return None
        weight = np.asarray(w.const)
        win = Window.from_attrs(node.attrs, weight.shape[2:])
        if not _static_time_pads(win, node.op_type == "Conv"):
            return None
        if node.op_type == "Conv":
            return _Planar(graph, node, win).conv(weight)
        bias = graph.values[node.inputs[2]].const if len(node.inputs) > 2 and node.inputs[2] else np.zeros(0)
        return _Planar(graph, node, win).conv_transpose(weight, bias) if bias is not None else None
    if node.op_type in POOLS and (len(node.outputs) == 1 or not node.outputs[1]):
        win = Window.from_attrs(node.attrs, node.attrs["kernel_shape"])
        return _Planar(graph, node, win).pool() if _static_time_pads(win, True) else None
    return None


def _static_time_pads(win: Window, same_ok: bool) -> bool:
    """Whether the temporal padding is known at compile time: explicit or VALID, or (``same_ok``)
    SAME with a temporal stride of 1 (then it pads ``dilation * (kernel - 1)`` whatever T is)."""
    return win.auto_pad in ("NOTSET", "VALID") or (same_ok and win.auto_pad in ("SAME_UPPER", "SAME_LOWER")
                                                   and win.strides[0] == 1)


class _Planar(NodeRewrite):
    """Emits one 3-D operator's 2-D replacement."""

    kind = "planar"

    def __init__(self, graph: Graph, node: Node, win: Window | None = None):   # None: a global pool
        super().__init__(graph, node)
        self.win = win

    def _geometry(self):
        """(strides, dilations, temporal pads (begin, end), the 2-D operator's padding attributes):
        the temporal pads as :meth:`Window.geometry` resolves them (SAME only with a temporal stride
        of 1, where they do not depend on T: resolved at T = 1); the 2-D operator keeps SAME for
        height and width."""
        win = self.win
        t0, t1, _, _ = win.geometry(0, 1)
        if win.auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            return list(win.strides), list(win.dilations), (t0, t1), {"auto_pad": win.auto_pad}
        _, h0, w0, _, h1, w1 = [0] * 6 if win.auto_pad == "VALID" else win.pads
        return list(win.strides), list(win.dilations), (t0, t1), {"pads": [h0, w0, h1, w1]}

    def conv(self, weight: np.ndarray) -> list[Node]:
        node, values = self.node, self.graph.values
        N, C, T, H, W = values[node.inputs[0]].shape
        _, OC, To, Ho, Wo = values[node.outputs[0]].shape
        oc, cg, kd, kh, kw = (int(d) for d in weight.shape)
        (sd, sh, sw), (dd, dh, dw), (pt0, pt1), hw_pads = self._geometry()
        planar = self._unfold_time(node.inputs[0], (N, C, T, H, W), To, kd, sd, dd, pt0, pt1)
        w2 = np.ascontiguousarray(weight.reshape(oc, cg * kd, kh, kw))
        inputs = [planar, self._value("weight", w2.shape, w2, w2.dtype)] + list(node.inputs[2:3])
        y = self._emit("Conv", inputs, "conv2d", [N * To, OC, Ho, Wo],
                       {"kernel_shape": [kh, kw], "strides": [sh, sw], "dilations": [dh, dw], **hw_pads,
                        "group": int(node.attrs.get("group", 1))})
        y = self.reshape(y, [N, To, OC, Ho, Wo], "frames")
        self.transpose_to(y, [0, 2, 1, 3, 4], [N, To, OC, Ho, Wo], "out", out=node.outputs[0])
        return self.nodes

    def _unfold_time(self, x: str, shape, To, kd: int, sd: int, dd: int, pt0: int, pt1: int) -> str:
        """``[N * To, C * kd, H, W]``: tap j of output frame t is padded frame ``t * sd + j * dd``."""
        N, C, T, H, W = shape
        if pt0 or pt1:
            x = self._emit("Pad", [x, self._ints("pads", [0, 0, pt0, 0, 0, 0, 0, pt1, 0, 0])], "pad_time",
                           [N, C, T + pt0 + pt1, H, W])
        taps = []
        for j in range(kd):
            # the tap's frames end dd * (kd - 1 - j) before the padded end: exactly To of them
            end = -dd * (kd - 1 - j) if j < kd - 1 else INT64_MAX
            tap = x if j * dd == 0 and end == INT64_MAX and sd == 1 else self._emit(
                "Slice", [x, self._ints(f"tap{j}_start", [j * dd]), self._ints(f"tap{j}_end", [end]),
                          self._ints(f"tap{j}_axis", [2]), self._ints(f"tap{j}_step", [sd])],
                f"tap{j}", [N, C, To, H, W])
            taps.append(tap)
        if kd == 1:
            frames = self.transpose_to(taps[0], [0, 2, 1, 3, 4], [N, C, To, H, W], "frames_first")
            return self.reshape(frames, [N * To, C, H, W], "planar")
        stacked = [self.unsqueeze(t, [N, C, To, H, W], [3], f"tap{j}_stacked")[0] for j, t in enumerate(taps)]
        cat = self._emit("Concat", stacked, "taps", [N, C, To, kd, H, W], {"axis": 3})
        frames = self.transpose_to(cat, [0, 2, 1, 3, 4, 5], [N, C, To, kd, H, W], "frames_first")
        return self.reshape(frames, [N * To, C * kd, H, W], "planar")

    def conv_transpose(self, weight: np.ndarray, bias: np.ndarray) -> list[Node] | None:
        node, values = self.node, self.graph.values
        N, C, T, H, W = values[node.inputs[0]].shape
        _, OC, To, Ho, Wo = values[node.outputs[0]].shape
        c, ocg, kd, kh, kw = (int(d) for d in weight.shape)
        (sd, sh, sw), (dd, dh, dw), (pt0, pt1), hw_pads = self._geometry()
        opad = [int(v) for v in node.attrs.get("output_padding", [0, 0, 0])]
        if (sd, dd, pt0, pt1, opad[0]) != (kd, 1, 0, 0, 0) or "output_shape" in node.attrs:
            return None                     # frames overlap or are cropped: not one 2-D ConvTranspose
        frames = self.transpose_to(node.inputs[0], [0, 2, 1, 3, 4], [N, C, T, H, W], "frames_first")
        frames = self.reshape(frames, [N * T, C, H, W], "planar")
        w2 = np.ascontiguousarray(weight.reshape(c, ocg * kd, kh, kw))
        inputs = [frames, self._value("weight", w2.shape, w2, w2.dtype)]
        if bias.size:
            b2 = np.repeat(np.asarray(bias, dtype=w2.dtype), kd)
            inputs.append(self._value("bias", b2.shape, b2, b2.dtype))
        y = self._emit("ConvTranspose", inputs, "conv_transpose2d", [N * T, OC * kd, Ho, Wo],
                       {"kernel_shape": [kh, kw], "strides": [sh, sw], "dilations": [dh, dw],
                        **hw_pads, "output_padding": opad[1:],
                        "group": int(node.attrs.get("group", 1))})
        y = self.reshape(y, [N, T, OC, kd, Ho, Wo], "taps")
        y = self.transpose_to(y, [0, 2, 1, 3, 4, 5], [N, T, OC, kd, Ho, Wo], "channels_first")
        self.reshape(y, [N, OC, To, Ho, Wo], "out", out=node.outputs[0])
        return self.nodes

    def pool(self) -> list[Node]:
        node, values = self.node, self.graph.values
        N, C, T, H, W = values[node.inputs[0]].shape
        _, _, To, Ho, Wo = values[node.outputs[0]].shape
        kd, kh, kw = (int(k) for k in node.attrs["kernel_shape"])
        (sd, sh, sw), (dd, dh, dw), (pt0, pt1), hw_pads = self._geometry()
        common = {k: v for k, v in node.attrs.items() if k in ("ceil_mode", "count_include_pad")}

        def pool2d(x, tag, shape, kernel, strides, dilations, padding):
            attrs = dict(common, kernel_shape=kernel, strides=strides, **padding)
            if dilations != [1, 1]:
                attrs["dilations"] = dilations
            return self._emit(node.op_type, [x], tag, shape, attrs)

        # every frame an image of one channel: the pool family takes a symbolic batch, not channels
        frames = self.reshape(node.inputs[0], [N * C * T, 1, H, W], "frames")
        y = pool2d(frames, "pool_hw", [N * C * T, 1, Ho, Wo], [kh, kw], [sh, sw], [dh, dw], hw_pads)
        if (kd, sd, pt0, pt1) == (1, 1, 0, 0):
            self.reshape(y, [N, C, T, Ho, Wo], "out", out=node.outputs[0])
            return self.nodes
        y = self.reshape(y, [N, C, T, Ho * Wo], "time_rows")
        y = pool2d(y, "pool_t", [N, C, To, Ho * Wo], [kd, 1], [sd, 1], [dd, 1], {"pads": [pt0, 0, pt1, 0]})
        self.reshape(y, [N, C, To, Ho, Wo], "out", out=node.outputs[0])
        return self.nodes

    def global_pool(self) -> list[Node]:
        node, values = self.node, self.graph.values
        N, C, *spatial = values[node.inputs[0]].shape
        flat = self.reshape(node.inputs[0], [N, C, sympy.Mul(*spatial), 1], "flat")
        y = self._emit(node.op_type, [flat], "pool2d", [N, C, 1, 1])
        self.reshape(y, [N, C] + [1] * len(spatial), "out", out=node.outputs[0])
        return self.nodes


__all__ = ["volumetric_as_planar"]
