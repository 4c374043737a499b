"""Recurrent operators: ``RNN``, ``GRU`` and ``LSTM`` (torch's ``nn.RNN``/``nn.GRU``/``nn.LSTM``
export as these, with both exporters).

What the registry gives them is the symbolic shape rule -- the sequence length and batch stay
symbols, the hidden size is the ``hidden_size`` attribute --, a numpy reference of the ONNX
equations, and a C kernel (:func:`recurrent_c`, the index family's writer: one kernel serves every
sequence length and batch). The kernel first computes every step's input projection ``W x_t + Wb``
(independent: in parallel over directions, batch entries and steps), then runs each (direction,
batch entry) recurrence in order, in parallel with the others: per step the recurrent product
``R h + Rb`` and the cell's gate equations. Both products are written as rank-1 updates over the
transposed weights (``acc[:] += Rᵀ[k, :] * h[k]``), so they vectorize along the gate rows with no
horizontal sums; the transposes are made once per call.

The reference follows the operator definitions: gates in ONNX order (RNN ``i``; GRU ``z, r, h``;
LSTM ``i, o, f, c``), ``direction`` forward / reverse / bidirectional, ``layout`` 0 (``[seq, batch,
...]``) or 1 (``[batch, seq, ...]``), optional biases (``Wb`` and ``Rb`` halves), ``sequence_lens``
(a batch entry's steps past its length produce zeros and leave its state alone; a reverse direction
starts at its own last step), ``initial_h`` / ``initial_c``, LSTM peepholes ``P`` (``i, o, f``) and
``input_forget``, GRU ``linear_before_reset``, ``clip`` on the gates' pre-activations, and the
``activations`` list with ``activation_alpha`` / ``activation_beta``.
"""
from __future__ import annotations

import math
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

#: the same functions as C expressions of a float ``x`` (``a``, ``b``: alpha and beta literals)
ACTIVATIONS_C: dict[str, str] = {
    "Sigmoid": "1.0f / (1.0f + expf(-x))",
    "Tanh": "tanhf(x)",
    "Relu": "(x > 0.0f ? x : 0.0f)",
    "Affine": "{a} * x + {b}",
    "LeakyRelu": "(x >= 0.0f ? x : {a} * x)",
    "ThresholdedRelu": "(x > {a} ? x : 0.0f)",
    "ScaledTanh": "{a} * tanhf({b} * x)",
    "HardSigmoid": "fminf(fmaxf({a} * x + {b}, 0.0f), 1.0f)",
    "Elu": "(x >= 0.0f ? x : {a} * expm1f(x))",
    "Softsign": "x / (1.0f + fabsf(x))",
    "Softplus": "(x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x)))",
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


def activation_specs(attr, op_type: str, defaults: tuple[str, ...], dirs: int, fail) -> list[list[tuple]]:
    """Per direction, the cell's activations as ``(name, alpha, beta)``: the ``activations``
    attribute (else the defaults), each taking its alpha/beta from the attribute lists in order
    where it has parameters."""
    names = attr("activations") or list(defaults) * dirs
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in names]
    alphas, betas = list(attr("activation_alpha") or []), list(attr("activation_beta") or [])
    specs = []
    for name in names:
        if name not in ACTIVATIONS:
            fail(f"activation {name!r} is not supported")
        _, a, b = ACTIVATIONS[name]
        a = alphas.pop(0) if a is not None and alphas else a
        b = betas.pop(0) if b is not None and betas else b
        specs.append((name, a, b))
    per = len(defaults)
    if len(specs) != per * dirs:
        fail(f"{len(specs)} activations for {dirs} direction(s) of {per}")
    return [specs[d * per:(d + 1) * per] for d in range(dirs)]


def _activations(call: OpCall, defaults: tuple[str, ...], dirs: int) -> list[list[Callable]]:
    """Per direction, the cell's activation functions with their alpha/beta bound."""
    def fail(why):
        raise ValueError(f"{call.op_type} node {call.name!r}: {why}")
    return [[lambda x, fn=ACTIVATIONS[n][0], a=a, b=b: fn(x, a, b) for n, a, b in per]
            for per in activation_specs(call.attr, call.op_type, defaults, dirs, fail)]


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


# =========================================================================== C kernel
def _c_float(v) -> str:
    return f"{float(v)!r}f" if math.isfinite(float(v)) else ("INFINITY" if v > 0 else "-INFINITY")


def _activation_functions(w, specs: list[list[tuple]]) -> list[list[str]]:
    """Per direction, the C function name of each of its activations (one static inline function
    per distinct activation and parameters)."""
    names, made = [], {}
    for per in specs:
        row = []
        for name, a, b in per:
            key = (name, a, b)
            if key not in made:
                made[key] = f"ts_act{len(made)}"
                body = ACTIVATIONS_C[name].format(a=_c_float(a if a is not None else 0),
                                                  b=_c_float(b if b is not None else 0))
                w.statics.append(f"static inline float {made[key]}(float x) {{ return {body}; }}  /* {name} */")
            row.append(made[key])
        names.append(row)
    return names


def _const_int(w, d, what: str) -> int:
    d = w.canon(d)
    if not d.is_Integer:
        w.fail(f"{what} is not a constant ({d})")
    return int(d)


def recurrent_c(w) -> None:
    """RNN / GRU / LSTM as one C kernel (see the module docstring): float32, any direction,
    layout, optional biases, sequence lengths (checked to lie in [0, seq]), initial states,
    peepholes, ``input_forget``, ``linear_before_reset``, ``clip`` and activation list."""
    op = w.op_type
    gates, defaults, _ = CELLS[op]
    x = w.arg(0)
    if x.ctype != "float":
        w.fail(f"element type {x.dtype}: the recurrent C kernel computes in float32")
    direction = w.attr("direction", "forward")
    dirs = _directions(direction, w.fail)
    layout = int(w.attr("layout", 0))
    W, R = w.arg(1), w.arg(2)
    H = _const_int(w, R.shape[-1], "the hidden size (R's last axis)")
    GH, I = gates * H, w.c(x.shape[2])
    S, NB = (w.c(x.shape[1]), w.c(x.shape[0])) if layout else (w.c(x.shape[0]), w.c(x.shape[1]))
    funcs = _activation_functions(w, activation_specs(w.attr, op, defaults, dirs, w.fail))
    clip = w.attr("clip")
    lbr = bool(w.attr("linear_before_reset", 0))
    act = _Acts(funcs, dirs, clip)
    B = w.arg(3) if w.has_arg(3) else None
    lens = w.arg(4) if w.has_arg(4) else None
    h0 = w.arg(5) if w.has_arg(5) else None
    c0 = w.arg(6) if op == "LSTM" and w.has_arg(6) else None
    P = w.arg(7) if op == "LSTM" and w.has_arg(7) else None
    reverse = {"forward": "0", "reverse": "1", "bidirectional": "(d == 1)"}[direction]
    w.emit(f"/* {op} {direction}, layout {layout}: [{dirs} x {NB}] recurrences of up to {S} steps, hidden {H}, "
           f"{gates} gate(s) per step; every step's input projection first, then each recurrence in order */")
    wt, rt = w.scratch("wt", "float", f"{dirs} * ({I}) * {GH}"), w.scratch("rt", "float", f"{dirs * H * GH}")
    gx = w.scratch("gx", "float", f"{dirs} * ({NB}) * ({S}) * {GH}")
    st = w.scratch("st", "float", f"{dirs} * ({NB}) * {2 * H + 2 * GH}")
    w.emit("/* the weights transposed: each product a sum of rank-1 updates along the gate rows */")
    w.parallel_for([("d", str(dirs)), ("j", str(GH))], work=f"{dirs * GH} * (({I}) + {H})")
    w.emit(f"    for (int64_t k = 0; k < {I}; ++k) {wt}[(d * ({I}) + k) * {GH} + j] = {W.at(f'(d * {GH} + j) * ({I}) + k')};")
    w.emit(f"    for (int64_t k = 0; k < {H}; ++k) {rt}[(d * {H} + k) * {GH} + j] = {R.at(f'(d * {GH} + j) * {H} + k')};")
    w.emit("}")
    x_row = f"(b * ({S}) + t)" if layout else f"(t * ({NB}) + b)"
    w.emit("/* input projections W x_t + Wb of every step: independent */")
    w.parallel_for([("d", str(dirs)), ("b", NB), ("t", S)], work=f"{dirs} * ({NB}) * ({S}) * {GH} * ({I})")
    w.emit(f"    float *restrict g = {gx} + ((d * ({NB}) + b) * ({S}) + t) * {GH};")
    w.emit(f"    const float *restrict xt = &{x.at(f'{x_row} * ({I})')};")
    w.emit(f"    for (int64_t j = 0; j < {GH}; ++j) g[j] = {B.at(f'd * {2 * GH} + j') if B else '0.0f'};")
    w.emit(f"    for (int64_t k = 0; k < {I}; ++k) {{")
    w.emit(f"        const float xk = xt[k]; const float *restrict wk = {wt} + (d * ({I}) + k) * {GH};")
    w.emit("        #pragma omp simd")
    w.emit(f"        for (int64_t j = 0; j < {GH}; ++j) g[j] += wk[j] * xk;")
    w.emit("    }")
    w.emit("}")
    y = w.out(0) if w.has_out(0) else None
    yh = w.out(1) if w.has_out(1) else None
    yc = w.out(2) if op == "LSTM" and w.has_out(2) else None
    state = f"(b * {dirs} + d) * {H}" if layout else f"(d * ({NB}) + b) * {H}"
    y_at = (lambda t: f"((b * ({S}) + {t}) * {dirs} + d) * {H}") if layout else \
           (lambda t: f"(({t} * {dirs} + d) * ({NB}) + b) * {H}")
    w.emit("/* the recurrences: each (direction, batch entry) in order over its steps */")
    w.parallel_for([("d", str(dirs)), ("b", NB)], work=f"{dirs} * ({NB}) * ({S}) * {GH} * {H}", min_work=0)
    w.emit(f"    float *restrict h = {st} + (d * ({NB}) + b) * {2 * H + 2 * GH}, *restrict c = h + {H};")
    w.emit(f"    float *restrict rec = c + {H}, *restrict tmp = rec + {GH};")
    n = w.count_check(lens.at("b"), S, 4, "b") if lens else S
    w.emit(f"    const int64_t len = {n};")
    w.emit(f"    const int reverse = {reverse};")
    w.emit(f"    for (int64_t i = 0; i < {H}; ++i) {{")
    w.emit(f"        h[i] = {h0.at(f'{state} + i') if h0 else '0.0f'};")
    w.emit(f"        c[i] = {c0.at(f'{state} + i') if c0 else '0.0f'};")
    w.emit("    }")
    if y:
        w.emit(f"    for (int64_t t = len; t < {S}; ++t)     /* steps past the entry's length: zeros */")
        w.emit(f"        for (int64_t i = 0; i < {H}; ++i) {y.at(y_at('t') + ' + i')} = 0.0f;")
    w.emit("    for (int64_t t = 0; t < len; ++t) {")
    w.emit("        const int64_t pos = reverse ? len - 1 - t : t;")
    w.emit(f"        const float *restrict g = {gx} + ((d * ({NB}) + b) * ({S}) + pos) * {GH};")
    rb = (lambda j: B.at(f"d * {2 * GH} + {GH} + {j}")) if B else (lambda j: "0.0f")
    rows = 2 * H if op == "GRU" and not lbr else GH     # GRU's h gate reads r * h: a second product
    _recurrent_product(w, rt, rb, H, GH, rows_from=0, rows_to=rows, vec="h")
    _CELL_C[op](w, act, H, GH, rt, rb, P, lbr)
    if y:
        w.emit(f"        for (int64_t i = 0; i < {H}; ++i) {y.at(y_at('pos') + ' + i')} = h[i];")
    w.emit("    }")
    for out, v in ((yh, "h"), (yc, "c")):
        if out:
            w.emit(f"    for (int64_t i = 0; i < {H}; ++i) {out.at(f'{state} + i')} = {v}[i];")
    w.emit("}")


def _recurrent_product(w, rt: str, rb, H: int, GH: int, rows_from: int, rows_to: int, vec: str) -> None:
    """``rec[j] = Rb[j] + sum_k R[j, k] * vec[k]`` for gate rows ``[rows_from, rows_to)``."""
    w.emit(f"        for (int64_t j = {rows_from}; j < {rows_to}; ++j) rec[j] = {rb('j')};")
    w.emit(f"        for (int64_t k = 0; k < {H}; ++k) {{")
    w.emit(f"            const float vk = {vec}[k]; const float *restrict rk = {rt} + (d * {H} + k) * {GH};")
    w.emit("            #pragma omp simd")
    w.emit(f"            for (int64_t j = {rows_from}; j < {rows_to}; ++j) rec[j] += rk[j] * vk;")
    w.emit("        }")


class _Acts:
    """The C calls of a direction's activations, with ``clip`` on the gates' pre-activations."""

    def __init__(self, funcs, dirs: int, clip):
        self.funcs, self.dirs, self.clip = funcs, dirs, clip

    def __call__(self, k: int, arg: str, clipped: bool = True) -> str:
        if self.clip is not None and clipped:
            c = _c_float(self.clip)
            arg = f"fminf(fmaxf({arg}, -{c}), {c})"
        if self.dirs == 1 or self.funcs[0][k] == self.funcs[1][k]:
            return f"{self.funcs[0][k]}({arg})"
        return f"(d ? {self.funcs[1][k]}({arg}) : {self.funcs[0][k]}({arg}))"


def _rnn_cell_c(w, act, H, GH, rt, rb, P, lbr) -> None:
    w.emit(f"        for (int64_t i = 0; i < {H}; ++i) h[i] = {act(0, 'g[i] + rec[i]')};")


def _gru_cell_c(w, act, H, GH, rt, rb, P, lbr) -> None:
    """Gates z, r, h (ONNX order); without ``linear_before_reset`` the h gate's product reads
    ``r * h``, so it runs after r."""
    w.emit(f"        for (int64_t i = 0; i < {H}; ++i) {{")
    w.emit(f"            tmp[i] = {act(0, 'g[i] + rec[i]')};                       /* z */")
    w.emit(f"            tmp[{H} + i] = {act(0, f'g[{H} + i] + rec[{H} + i]')};   /* r */")
    w.emit("        }")
    if lbr:
        n = act(1, f"g[{2 * H} + i] + tmp[{H} + i] * rec[{2 * H} + i]")
    else:
        w.emit(f"        for (int64_t i = 0; i < {H}; ++i) tmp[{2 * H} + i] = tmp[{H} + i] * h[i];   /* r * h */")
        w.emit(f"        {{ const float *restrict rh = tmp + {2 * H};")
        _recurrent_product(w, rt, rb, H, GH, rows_from=2 * H, rows_to=GH, vec="rh")
        w.emit("        }")
        n = act(1, f"g[{2 * H} + i] + rec[{2 * H} + i]")
    w.emit(f"        for (int64_t i = 0; i < {H}; ++i) {{")
    w.emit(f"            const float n = {n};")
    w.emit("            h[i] = (1.0f - tmp[i]) * n + tmp[i] * h[i];")
    w.emit("        }")


def _lstm_cell_c(w, act, H, GH, rt, rb, P, lbr) -> None:
    """Gates i, o, f, c (ONNX order); peepholes ``P`` (i, o, f) read the previous cell state for
    i and f, the new one for o."""
    def peep(k, cell):
        return f" + {P.at(f'd * {3 * H} + {k * H} + i')} * {cell}" if P else ""
    pi, po, pf = peep(0, "c[i]"), peep(1, "cn"), peep(2, "c[i]")
    w.emit(f"        for (int64_t i = 0; i < {H}; ++i) {{")
    w.emit(f"            const float ig = {act(0, 'g[i] + rec[i]' + pi)};")
    if w.attr("input_forget", 0):
        w.emit("            const float fg = 1.0f - ig;")
    else:
        w.emit(f"            const float fg = {act(0, f'g[{2 * H} + i] + rec[{2 * H} + i]' + pf)};")
    w.emit(f"            const float cn = fg * c[i] + ig * {act(1, f'g[{3 * H} + i] + rec[{3 * H} + i]')};")
    w.emit(f"            const float og = {act(0, f'g[{H} + i] + rec[{H} + i]' + po)};")
    w.emit(f"            h[i] = og * {act(2, 'cn', clipped=False)};   /* the cell state unclipped, as onnxruntime */")
    w.emit("            c[i] = cn;")
    w.emit("        }")


_CELL_C = {"RNN": _rnn_cell_c, "GRU": _gru_cell_c, "LSTM": _lstm_cell_c}

for _op in CELLS:
    register(OpDef(_op, FusionClass.OPAQUE, recurrent_shape, recurrent_ref, arity=(3, 8 if _op == "LSTM" else 6),
                   c_kernel=recurrent_c))

__all__ = ["ACTIVATIONS", "ACTIVATIONS_C", "CELLS", "activation_specs", "recurrent_c", "recurrent_ref",
           "recurrent_shape"]
