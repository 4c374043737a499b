"""Recurrent operators: ``RNN``, ``GRU`` and ``LSTM`` (torch's ``nn.RNN``/``nn.GRU``/``nn.LSTM``
export as these, with both exporters).

What the registry gives them is the symbolic shape rule -- the sequence length and batch stay
symbols, the hidden size is the ``hidden_size`` attribute -- and a numpy reference of the ONNX
equations, which the compiled model runs on the numpy fallback: a recurrence is a sequential loop
over a dynamic number of steps, each a small matrix product, which no macro-kernel family generates
yet. Everything around it (embeddings, projections, heads) compiles natively as usual.

The reference follows the operator definitions: gates in ONNX order (RNN ``i``; GRU ``z, r, h``;
LSTM ``i, o, f, c``), ``direction`` forward / reverse / bidirectional, ``layout`` 0 (``[seq, batch,
...]``) or 1 (``[batch, seq, ...]``), optional biases (``Wb`` and ``Rb`` halves), ``sequence_lens``
(a batch entry's steps past its length produce zeros and leave its state alone; a reverse direction
starts at its own last step), ``initial_h`` / ``initial_c``, LSTM peepholes ``P`` (``i, o, f``) and
``input_forget``, GRU ``linear_before_reset``, ``clip`` on the gates' pre-activations, and the
``activations`` list with ``activation_alpha`` / ``activation_beta``.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import sympy

from tscomp.graph.ops.registry import FusionClass, OpCall, OpDef, ShapeContext, register

#: (gate count, default activations per direction, state outputs)
CELLS = {"RNN": (1, ("Tanh",), 1), "GRU": (3, ("Sigmoid", "Tanh"), 1), "LSTM": (4, ("Sigmoid", "Tanh", "Tanh"), 2)}

_SIGMOID = lambda x, a, b: 1 / (1 + np.exp(-x))      # noqa: E731
#: name -> f(x, alpha, beta), alpha/beta defaults as in the ONNX operator definitions
ACTIVATIONS: dict[str, tuple[Callable, float | None, float | None]] = {
    "Sigmoid": (_SIGMOID, None, None),
    "Tanh": (lambda x, a, b: np.tanh(x), None, None),
    "Relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "Affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "LeakyRelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "ThresholdedRelu": (lambda x, a, b: np.where(x > a, x, 0), 1.0, None),
    "ScaledTanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "HardSigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "Elu": (lambda x, a, b: np.where(x >= 0, x, a * np.expm1(x)), 1.0, None),
    "Softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "Softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}


def _directions(direction: str, fail) -> int:
    if direction not in ("forward", "reverse", "bidirectional"):
        fail(f"direction {direction!r} is not forward, reverse or bidirectional")
    return 2 if direction == "bidirectional" else 1


def recurrent_shape(ctx: ShapeContext) -> None:
    """Y ``[seq, dirs, batch, hidden]`` (layout 1: ``[batch, seq, dirs, hidden]``), Y_h and Y_c
    ``[dirs, batch, hidden]`` (layout 1: ``[batch, dirs, hidden]``)."""
    x = ctx.shape(0)
    if len(x) != 3:
        ctx.fail(f"X must be 3-d, got rank {len(x)}")
    gates, _, states = CELLS[ctx.op_type]
    dirs = _directions(ctx.attr("direction", "forward"), ctx.fail)
    hidden = ctx.attr("hidden_size")
    w = ctx.shape(1)
    if hidden is None:       # optional in the spec: W's rows are gates x hidden
        if not w[1].is_Integer:
            ctx.fail("hidden_size is missing and W's row count is not a constant")
        hidden = int(w[1]) // gates
    hidden = int(hidden)
    ctx.unify(w[0], dirs, "W's direction count")
    ctx.unify(w[1], gates * hidden, f"W's rows ({gates} gates x hidden_size {hidden})")
    layout = int(ctx.attr("layout", 0))
    seq, batch = (x[1], x[0]) if layout else (x[0], x[1])
    ctx.unify(w[2], x[2], "W's columns and X's input size")
    h = sympy.Integer(hidden)
    y = [batch, seq, dirs, h] if layout else [seq, dirs, batch, h]
    state = [batch, dirs, h] if layout else [dirs, batch, h]
    for k, shape in enumerate([y] + [state] * states):
        if k < ctx.num_outputs:
            ctx.set_output(k, ctx.dtype(0), shape)


def _activations(call: OpCall, defaults: tuple[str, ...], dirs: int) -> list[list[Callable]]:
    """Per direction, the cell's activation functions with their alpha/beta bound."""
    names = call.attr("activations") or list(defaults) * dirs
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    alphas, betas = list(call.attr("activation_alpha") or []), list(call.attr("activation_beta") or [])
    funcs = []
    for k, name in enumerate(names):
        if name not in ACTIVATIONS:
            raise ValueError(f"{call.op_type} node {call.name!r}: activation {name!r} is not supported")
        fn, a, b = ACTIVATIONS[name]
        a = alphas.pop(0) if a is not None and alphas else a
        b = betas.pop(0) if b is not None and betas else b
        funcs.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b))
    per = len(defaults)
    if len(funcs) != per * dirs:
        raise ValueError(f"{call.op_type} node {call.name!r}: {len(funcs)} activations for {dirs} direction(s) "
                         f"of {per}")
    return [funcs[d * per:(d + 1) * per] for d in range(dirs)]


def recurrent_ref(call: OpCall, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None):
    op = call.op_type
    gates, defaults, states = CELLS[op]
    direction = call.attr("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    layout = int(call.attr("layout", 0))
    x = np.swapaxes(X, 0, 1) if layout else X                 # [seq, batch, input]
    seq, batch = x.shape[:2]
    hidden = R.shape[-1]
    dtype = X.dtype
    lens = np.full(batch, seq, np.int64) if sequence_lens is None else np.asarray(sequence_lens, np.int64)
    if B is None:
        B = np.zeros((dirs, 2 * gates * hidden), dtype)
    h0 = np.zeros((dirs, batch, hidden), dtype) if initial_h is None else \
        (np.swapaxes(initial_h, 0, 1) if layout else initial_h)
    c0 = np.zeros((dirs, batch, hidden), dtype) if initial_c is None else \
        (np.swapaxes(initial_c, 0, 1) if layout else initial_c)
    acts = _activations(call, defaults, dirs)
    clip = call.attr("clip")
    y = np.zeros((seq, dirs, batch, hidden), dtype)
    y_h, y_c = np.zeros((dirs, batch, hidden), dtype), np.zeros((dirs, batch, hidden), dtype)
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        step = _CELL_STEPS[op]
        h, c = h0[d].astype(dtype), c0[d].astype(dtype)
        wb, rb = B[d][:gates * hidden], B[d][gates * hidden:]
        p = None if P is None else P[d]
        for t in range(seq):
            active = t < lens                                   # batch entries still in their sequence
            pos = np.where(reverse, lens - 1 - t, t)             # each entry's own step
            xt = x[np.clip(pos, 0, seq - 1), np.arange(batch)]
            gx = xt @ W[d].T + wb
            h_new, c_new = step(gx, h, c, R[d], rb, p, acts[d], clip, call, hidden)
            h = np.where(active[:, None], h_new, h).astype(dtype)
            c = np.where(active[:, None], c_new, c).astype(dtype)
            rows = np.nonzero(active)[0]
            y[pos[rows], d, rows] = h[rows]
        y_h[d], y_c[d] = h, c
    outs = [y, y_h, y_c][:1 + states]
    if layout:
        outs = [np.transpose(outs[0], (2, 0, 1, 3))] + [np.swapaxes(o, 0, 1) for o in outs[1:]]
    return tuple(np.ascontiguousarray(o) for o in outs[:call.num_outputs])


def _clipped(v, clip):
    return v if clip is None else np.clip(v, -clip, clip)


def _rnn_step(gx, h, c, R, rb, p, acts, clip, call, hidden):
    return acts[0](_clipped(gx + h @ R.T + rb, clip)), c


def _gru_step(gx, h, c, R, rb, p, acts, clip, call, hidden):
    f, g = acts
    rz, rr, rh = (R[k * hidden:(k + 1) * hidden] for k in range(3))
    bz, br, bh = (rb[k * hidden:(k + 1) * hidden] for k in range(3))
    xz, xr, xh = (gx[:, k * hidden:(k + 1) * hidden] for k in range(3))
    z = f(_clipped(xz + h @ rz.T + bz, clip))
    r = f(_clipped(xr + h @ rr.T + br, clip))
    if call.attr("linear_before_reset", 0):
        n = g(_clipped(xh + r * (h @ rh.T + bh), clip))
    else:
        n = g(_clipped(xh + (r * h) @ rh.T + bh, clip))
    return (1 - z) * n + z * h, c


def _lstm_step(gx, h, c, R, rb, p, acts, clip, call, hidden):
    f, g, hf = acts
    pre = gx + h @ R.T + rb
    gi, go, gf, gc = (pre[:, k * hidden:(k + 1) * hidden] for k in range(4))
    pi, po, pf = (np.zeros(hidden, gx.dtype),) * 3 if p is None else (p[k * hidden:(k + 1) * hidden] for k in range(3))
    i = f(_clipped(gi + pi * c, clip))
    fg = 1 - i if call.attr("input_forget", 0) else f(_clipped(gf + pf * c, clip))
    c_new = fg * c + i * g(_clipped(gc, clip))
    o = f(_clipped(go + po * c_new, clip))
    return o * hf(c_new), c_new


_CELL_STEPS = {"RNN": _rnn_step, "GRU": _gru_step, "LSTM": _lstm_step}

for _op in CELLS:
    register(OpDef(_op, FusionClass.OPAQUE, recurrent_shape, recurrent_ref, arity=(3, 8 if _op == "LSTM" else 6)))

__all__ = ["ACTIVATIONS", "CELLS", "recurrent_ref", "recurrent_shape"]
