"""Recurrent operators: ``RNN``, ``GRU`` and ``LSTM`` (torch's ``nn.RNN``/``nn.GRU``/``nn.LSTM``
export as these, with both exporters).

What the registry gives them is the symbolic shape rule -- the sequence length and batch stay
symbols, the hidden size is the ``hidden_size`` attribute -- and a numpy reference of the ONNX
equations. With constant weights (every exported model), the graph stage
(:func:`tscomp.graph.simplify.recurrences_as_projections`) splits each into what it is: the input
projections of every step, ``X Wᵀ + Wb (+ Rb)``, one MatMul the GEMM family compiles; and the
recurrence itself, the internal op ``tscomp.Recurrence`` (:data:`RECURRENCE`), which reads those
projections and the recurrent weight packed at compile time in panels of gate rows
(:func:`pack_recurrent_weight`: per step, ``R h`` is a sum of rank-1 updates along the gate rows,
held in registers a block of rows at a time, no horizontal sums, each block streaming its panels
front to back) and runs as a C kernel of the index family (:func:`recurrence_c`): each (direction,
batch entry) recurrence in order over its steps, in parallel with the others, or a large one split
among the threads by hidden unit; the gate equations in vectorized loops.

The reference follows the operator definitions: gates in ONNX order (RNN ``i``; GRU ``z, r, h``;
LSTM ``i, o, f, c``), ``direction`` forward / reverse / bidirectional, ``layout`` 0 (``[seq, batch,
...]``) or 1 (``[batch, seq, ...]``), optional biases (``Wb`` and ``Rb`` halves), ``sequence_lens``
(a batch entry's steps past its length produce zeros and leave its state alone; a reverse direction
starts at its own last step), ``initial_h`` / ``initial_c``, LSTM peepholes ``P`` (``i, o, f``) and
``input_forget``, GRU ``linear_before_reset``, ``clip`` on the gates' pre-activations, and the
``activations`` list with ``activation_alpha`` / ``activation_beta``.
"""
from __future__ import annotations

from dataclasses import dataclass
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

#: the same functions as C expressions of a float ``x`` (``a``, ``b``: alpha and beta literals), in
#: selects, ``expf`` and the registry Sigmoid's own ``ts_sigmoidf`` so that a loop over them
#: vectorizes (tanh as ``1 - 2 / (1 + e^2x)``, within 2e-7 of tanhf: GCC left a loop over the
#: rational ``ts_tanhf`` scalar, its division not speculated)
ACTIVATIONS_C: dict[str, str] = {
    "Sigmoid": "ts_sigmoidf(x)",
    "Tanh": "(1.0f - 2.0f / (1.0f + expf(2.0f * x)))",
    "Relu": "(x > 0.0f ? x : 0.0f)",
    "Affine": "{a} * x + {b}",
    "LeakyRelu": "(x >= 0.0f ? x : {a} * x)",
    "ThresholdedRelu": "(x > {a} ? x : 0.0f)",
    "ScaledTanh": "{a} * (1.0f - 2.0f / (1.0f + expf(2.0f * {b} * x)))",
    "HardSigmoid": "({a} * x + {b} < 0.0f ? 0.0f : ({a} * x + {b} > 1.0f ? 1.0f : {a} * x + {b}))",
    "Elu": "(x >= 0.0f ? x : {a} * (expf(x) - 1.0f))",
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
    _set_outputs(ctx, seq, batch, dirs, hidden, states, layout)


def _set_outputs(ctx: ShapeContext, seq, batch, dirs: int, hidden: int, states: int, layout: int) -> None:
    h = sympy.Integer(hidden)
    y = [batch, seq, dirs, h] if layout else [seq, dirs, batch, h]
    state = [batch, dirs, h] if layout else [dirs, batch, h]
    for k, shape in enumerate([y] + [state] * states):
        if k < ctx.num_outputs:
            ctx.set_output(k, ctx.dtype(0), shape)


def recurrence_shape(ctx: ShapeContext) -> None:
    """``tscomp.Recurrence``: the projections ``[seq, batch, dirs * gates * hidden]`` (layout 1:
    ``[batch, seq, ...]``), the packed recurrent weight ``[dirs, gates * panels, hidden, PANEL]``
    (:func:`pack_recurrent_weight`); outputs as the ONNX op's."""
    cell = ctx.attr("cell")
    if cell not in CELLS:
        ctx.fail(f"cell {cell!r} is not one of {', '.join(CELLS)}")
    gates, _, states = CELLS[cell]
    dirs = _directions(ctx.attr("direction", "forward"), ctx.fail)
    hidden, layout = int(ctx.attr("hidden_size")), int(ctx.attr("layout", 0))
    g = ctx.shape(0)
    if len(g) != 3:
        ctx.fail(f"the projections must be 3-d, got rank {len(g)}")
    ctx.unify(g[2], dirs * gates * hidden, "the projections' last axis (directions x gates x hidden)")
    packed = (dirs, gates * -(-hidden // PANEL), hidden, PANEL)
    for a, b, what in zip(ctx.shape(1), packed, ("directions", "gate panels", "hidden", "panel rows")):
        ctx.unify(a, b, f"the packed recurrent weight: {what}")
    seq, batch = (g[1], g[0]) if layout else (g[0], g[1])
    _set_outputs(ctx, seq, batch, dirs, hidden, states, layout)


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
    gates = CELLS[call.op_type][0]
    dirs = 2 if call.attr("direction", "forward") == "bidirectional" else 1
    x = np.swapaxes(X, 0, 1) if int(call.attr("layout", 0)) else X                 # [seq, batch, input]
    hidden = R.shape[-1]
    if B is None:
        B = np.zeros((dirs, 2 * gates * hidden), X.dtype)
    proj = np.stack([x @ W[d].T + B[d][:gates * hidden] for d in range(dirs)], axis=2)   # [seq, batch, dirs, GH]
    rb = np.stack([B[d][gates * hidden:] for d in range(dirs)])
    return _recurrences(call, call.op_type, proj.astype(X.dtype), R, rb, sequence_lens, initial_h, initial_c, P)


def recurrence_ref(call: OpCall, proj, Rt, Rb=None, sequence_lens=None, initial_h=None, initial_c=None, P=None):
    """``tscomp.Recurrence``: ``Rt`` the recurrent weight packed (:func:`pack_recurrent_weight`);
    ``Rb`` the recurrent bias that cannot join the projections (GRU's h gate with
    ``linear_before_reset``: ``[dirs, hidden]``), absent otherwise."""
    cell = call.attr("cell")
    gates = CELLS[cell][0]
    dirs = 2 if call.attr("direction", "forward") == "bidirectional" else 1
    g = np.swapaxes(proj, 0, 1) if int(call.attr("layout", 0)) else proj
    hidden = Rt.shape[2]
    rb = np.zeros((dirs, gates * hidden), proj.dtype)
    if Rb is not None:
        rb[:, (gates - 1) * hidden:] = Rb
    return _recurrences(call, cell, g.reshape(*g.shape[:2], dirs, gates * hidden), unpack_recurrent_weight(Rt, gates),
                        rb, sequence_lens, initial_h, initial_c, P)


def _recurrences(call: OpCall, cell: str, proj, R, rb, sequence_lens, initial_h, initial_c, P):
    """The recurrences over ``proj`` ``[seq, batch, dirs, gates * hidden]`` (each step's input
    projection with its bias), ``R`` ``[dirs, gates * hidden, hidden]`` and the recurrent bias."""
    _, defaults, states = CELLS[cell]
    direction = call.attr("direction", "forward")
    dirs = 2 if direction == "bidirectional" else 1
    layout = int(call.attr("layout", 0))
    seq, batch = proj.shape[:2]
    hidden = R.shape[-1]
    dtype = proj.dtype
    lens = np.full(batch, seq, np.int64) if sequence_lens is None else np.asarray(sequence_lens, np.int64)
    h0 = np.zeros((dirs, batch, hidden), dtype) if initial_h is None else \
        (np.swapaxes(initial_h, 0, 1) if layout else initial_h)
    c0 = np.zeros((dirs, batch, hidden), dtype) if initial_c is None else \
        (np.swapaxes(initial_c, 0, 1) if layout else initial_c)
    acts = _activations(call, defaults, dirs)
    clip = call.attr("clip")
    y = np.zeros((seq, dirs, batch, hidden), dtype)
    y_h, y_c = np.zeros((dirs, batch, hidden), dtype), np.zeros((dirs, batch, hidden), dtype)
    step = _CELL_STEPS[cell]
    for d in range(dirs):
        reverse = direction == "reverse" or d == 1
        h, c = h0[d].astype(dtype), c0[d].astype(dtype)
        p = None if P is None else P[d]
        for t in range(seq):
            active = t < lens                                   # batch entries still in their sequence
            pos = np.where(reverse, lens - 1 - t, t)             # each entry's own step
            gx = proj[np.clip(pos, 0, seq - 1), np.arange(batch), d]
            h_new, c_new = step(gx, h, c, R[d], rb[d], p, acts[d], clip, call, hidden)
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


# =========================================================================== tscomp.Recurrence
#: the internal recurrence op (domain, op type) the graph stage splits RNN / GRU / LSTM into
RECURRENCE = ("tscomp", "Recurrence")


def _activation_functions(w, specs: list[list[tuple]]) -> list[list[str]]:
    """Per direction, the C function of each of its activations (one vectorizable static function
    per distinct activation and parameters; ``expf``/``tanhf`` become the vectorizable helpers)."""
    names, made = [], {}
    for per in specs:
        row = []
        for name, a, b in per:
            key = (name, a, b)
            if key not in made:
                made[key] = f"ts_act{len(made)}"
                body = ACTIVATIONS_C[name].format(a=w.literal(a if a is not None else 0, np.float32),
                                                  b=w.literal(b if b is not None else 0, np.float32))
                w.statics += ["#pragma omp declare simd notinbranch",
                              f"static inline float {made[key]}(float x) {{ return {body}; }}  /* {name} */"]
            row.append(made[key])
        names.append(row)
    return names


#: gate rows per panel of the packed R (:func:`pack_recurrent_weight`): two AVX-512 vectors
PANEL = 32

#: the recurrent product over R packed in panels (``out[j] = sum_k R[j, k] * v[k]`` for the
#: rows of ``np`` consecutive panels): each panel's rows for every ``k`` lie together, so a block
#: of the product streams its panels front to back (read by rows of a plain ``Rᵀ``, every ``k``
#: started a new 4 KiB page). Eight accumulators per kernel -- four panels of one batch entry, or
#: one panel of four entries, which then share each load -- enough independent FMA chains to
#: issue two a cycle. GCC vector types keep them in registers (arrays of them were spilled; two
#: AVX2 registers each on AVX2 hosts); fp-contract makes ``a * b + c`` one FMA (-std=c11 does not)
PRODUCT_HELPER = """\
#pragma GCC push_options
#pragma GCC optimize ("fp-contract=fast")
typedef float ts_vf __attribute__((vector_size(64)));
static inline ts_vf ts_vload(const float *p) { ts_vf v; __builtin_memcpy(&v, p, sizeof v); return v; }
static inline void ts_vstore(float *p, ts_vf v) { __builtin_memcpy(p, &v, sizeof v); }
/* one batch entry, four panels (128 gate rows) */
static inline void ts_panels4(float *restrict out, const float *restrict pan, int64_t ps,
                              const float *restrict v, int64_t K)
{
    ts_vf a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    const float *restrict p0 = pan, *restrict p1 = pan + ps, *restrict p2 = pan + 2 * ps, *restrict p3 = pan + 3 * ps;
    for (int64_t k = 0; k < K; ++k) {
        const float x = v[k];
        a0 += ts_vload(p0 + 32 * k) * x; b0 += ts_vload(p0 + 32 * k + 16) * x;
        a1 += ts_vload(p1 + 32 * k) * x; b1 += ts_vload(p1 + 32 * k + 16) * x;
        a2 += ts_vload(p2 + 32 * k) * x; b2 += ts_vload(p2 + 32 * k + 16) * x;
        a3 += ts_vload(p3 + 32 * k) * x; b3 += ts_vload(p3 + 32 * k + 16) * x;
    }
    ts_vstore(out, a0); ts_vstore(out + 16, b0); ts_vstore(out + 32, a1); ts_vstore(out + 48, b1);
    ts_vstore(out + 64, a2); ts_vstore(out + 80, b2); ts_vstore(out + 96, a3); ts_vstore(out + 112, b3);
}
/* one batch entry, one panel: even and odd k in separate accumulators */
static inline void ts_panels1(float *restrict out, const float *restrict pan, const float *restrict v, int64_t K)
{
    ts_vf a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0};
    int64_t k = 0;
    for (; k + 2 <= K; k += 2) {
        a0 += ts_vload(pan + 32 * k) * v[k]; b0 += ts_vload(pan + 32 * k + 16) * v[k];
        a1 += ts_vload(pan + 32 * k + 32) * v[k + 1]; b1 += ts_vload(pan + 32 * k + 48) * v[k + 1];
    }
    if (k < K) { a0 += ts_vload(pan + 32 * k) * v[k]; b0 += ts_vload(pan + 32 * k + 16) * v[k]; }
    ts_vstore(out, a0 + a1); ts_vstore(out + 16, b0 + b1);
}
/* four batch entries, one panel: each load serves all four */
static inline void ts_panel_x4(float *restrict o0, float *restrict o1, float *restrict o2, float *restrict o3,
                               const float *restrict pan, const float *restrict v0, const float *restrict v1,
                               const float *restrict v2, const float *restrict v3, int64_t K)
{
    ts_vf a0 = {0}, b0 = {0}, a1 = {0}, b1 = {0}, a2 = {0}, b2 = {0}, a3 = {0}, b3 = {0};
    for (int64_t k = 0; k < K; ++k) {
        const ts_vf r = ts_vload(pan + 32 * k), s = ts_vload(pan + 32 * k + 16);
        a0 += r * v0[k]; b0 += s * v0[k];
        a1 += r * v1[k]; b1 += s * v1[k];
        a2 += r * v2[k]; b2 += s * v2[k];
        a3 += r * v3[k]; b3 += s * v3[k];
    }
    ts_vstore(o0, a0); ts_vstore(o0 + 16, b0); ts_vstore(o1, a1); ts_vstore(o1 + 16, b1);
    ts_vstore(o2, a2); ts_vstore(o2 + 16, b2); ts_vstore(o3, a3); ts_vstore(o3 + 16, b3);
}
/* two batch entries, two panels */
static inline void ts_panels2_x2(float *restrict o0, float *restrict o1, const float *restrict pan, int64_t ps,
                                 const float *restrict v0, const float *restrict v1, int64_t K)
{
    ts_vf a0 = {0}, b0 = {0}, c0 = {0}, d0 = {0}, a1 = {0}, b1 = {0}, c1 = {0}, d1 = {0};
    const float *restrict p0 = pan, *restrict p1 = pan + ps;
    for (int64_t k = 0; k < K; ++k) {
        const ts_vf r = ts_vload(p0 + 32 * k), s = ts_vload(p0 + 32 * k + 16);
        const ts_vf t = ts_vload(p1 + 32 * k), u = ts_vload(p1 + 32 * k + 16);
        a0 += r * v0[k]; b0 += s * v0[k]; c0 += t * v0[k]; d0 += u * v0[k];
        a1 += r * v1[k]; b1 += s * v1[k]; c1 += t * v1[k]; d1 += u * v1[k];
    }
    ts_vstore(o0, a0); ts_vstore(o0 + 16, b0); ts_vstore(o0 + 32, c0); ts_vstore(o0 + 48, d0);
    ts_vstore(o1, a1); ts_vstore(o1 + 16, b1); ts_vstore(o1 + 32, c1); ts_vstore(o1 + 48, d1);
}
#pragma GCC pop_options
/* np panels (ps floats apart) of one entry */
static void ts_product(float *restrict out, const float *restrict pan, int64_t ps, const float *restrict v,
                       int64_t K, int64_t np)
{
    int64_t p = 0;
    for (; p + 4 <= np; p += 4) ts_panels4(out + 32 * p, pan + p * ps, ps, v, K);
    for (; p < np; ++p) ts_panels1(out + 32 * p, pan + p * ps, v, K);
}
/* np panels of nb entries (out and v rows os and vs apart), four entries at a time: two left over
   run two panels at a time, three as four with the last repeated into a scratch row */
static void ts_product_batch(float *restrict out, int64_t os, const float *restrict pan, int64_t ps,
                             const float *restrict v, int64_t vs, int64_t K, int64_t np, int64_t nb)
{
    float spare[32] __attribute__((aligned(64)));
    for (int64_t b = 0; b < nb; b += 4) {
        const int64_t m = nb - b < 4 ? nb - b : 4;
        if (m == 1) { ts_product(out + b * os, pan, ps, v + b * vs, K, np); continue; }
        if (m == 2) {       /* two entries: two panels at a time (no scratch rows) */
            int64_t p = 0;
            for (; p + 2 <= np; p += 2)
                ts_panels2_x2(out + b * os + 32 * p, out + (b + 1) * os + 32 * p, pan + p * ps, ps, v + b * vs,
                              v + (b + 1) * vs, K);
            for (; p < np; ++p)
                for (int64_t e = b; e < b + 2; ++e) ts_panels1(out + e * os + 32 * p, pan + p * ps, v + e * vs, K);
            continue;
        }
        for (int64_t p = 0; p < np; ++p) {
            float *o[4];
            const float *x[4];
            for (int64_t e = 0; e < 4; ++e) {
                o[e] = e < m ? out + (b + e) * os + 32 * p : spare;
                x[e] = v + (b + (e < m ? e : m - 1)) * vs;
            }
            ts_panel_x4(o[0], o[1], o[2], o[3], pan + p * ps, x[0], x[1], x[2], x[3], K);
        }
    }
}"""


def pack_recurrent_weight(R: np.ndarray) -> np.ndarray:
    """``R`` ``[dirs, gates * hidden, hidden]`` as the recurrence kernel reads it: per direction and
    gate, panels of :data:`PANEL` gate rows (the last zero-padded), each panel ``[hidden][PANEL]``
    (row ``j`` of the panel at ``k`` is ``R[gate * hidden + PANEL * p + j, k]``): shape
    ``[dirs, gates * panels, hidden, PANEL]``."""
    dirs, rows, hidden = R.shape
    gates, panels = rows // hidden, -(-hidden // PANEL)
    padded = np.zeros((dirs, gates, panels * PANEL, hidden), R.dtype)
    padded[:, :, :hidden] = R.reshape(dirs, gates, hidden, hidden)
    packed = padded.reshape(dirs, gates, panels, PANEL, hidden).transpose(0, 1, 2, 4, 3)
    return np.ascontiguousarray(packed.reshape(dirs, gates * panels, hidden, PANEL))


def unpack_recurrent_weight(packed: np.ndarray, gates: int) -> np.ndarray:
    """The inverse of :func:`pack_recurrent_weight`: ``R`` ``[dirs, gates * hidden, hidden]``."""
    dirs, _, hidden, _ = packed.shape
    panels = packed.shape[1] // gates
    R = packed.reshape(dirs, gates, panels, hidden, PANEL).transpose(0, 1, 2, 4, 3)
    return np.ascontiguousarray(R.reshape(dirs, gates, panels * PANEL, hidden)[:, :, :hidden].reshape(dirs, -1, hidden))

#: hidden units a thread of a split recurrence owns are whole multiples of this (whole panels)
SPLIT_CHUNK = 32
#: multiply-adds per step of the recurrent product from which the team splits a recurrence (its
#: barrier per step, ~1 us on 2 cores, then costs less than the product's half: LSTM hidden 256 is
#: 262,144; a GRU of hidden 128, 49,152, runs on one thread)
SPLIT_MIN_MACS = 1 << 17


class _Acts:
    """The C calls of a direction's activations, with ``clip`` on the gates' pre-activations."""

    def __init__(self, funcs, dirs: int, clip):
        self.funcs, self.dirs, self.clip = funcs, dirs, clip

    def __call__(self, k: int, arg: str, clipped: bool = True) -> str:
        if self.clip is not None and clipped:
            arg = f"ts_clip({arg})"
        if self.dirs == 1 or self.funcs[0][k] == self.funcs[1][k]:
            return f"{self.funcs[0][k]}({arg})"
        return f"(d ? {self.funcs[1][k]}({arg}) : {self.funcs[0][k]}({arg}))"


def recurrence_c(w) -> None:
    """``tscomp.Recurrence`` as one C kernel (see the module docstring): float32, any direction,
    layout, recurrent bias, sequence lengths (checked to lie in [0, seq]), initial states,
    peepholes, ``input_forget``, ``linear_before_reset``, ``clip`` and activation list.

    A small recurrence (fewer multiply-adds per step than :data:`SPLIT_MIN_MACS`) runs whole on
    one thread, the (direction, batch entry) recurrences in parallel. A large one is split among
    the team by hidden unit, a direction at a time, every batch entry in the same step: a thread
    owns the gate rows of its units (its panels of R stay in its own L2 cache from step to
    step, and one load of it serves four batch entries) and updates their state; one barrier per
    step (two for a GRU without ``linear_before_reset``) publishes the new state. Whole R per
    thread streamed from L3 every step (LSTM hidden 256: 1.4-1.7x onnxruntime at batch 4)."""
    cell = w.attr("cell")
    gates, defaults, _ = CELLS[cell]
    proj, rt = w.arg(0), w.arg(1)
    if proj.ctype != "float":
        w.fail(f"element type {proj.dtype}: the recurrence C kernel computes in float32")
    direction = w.attr("direction", "forward")
    dirs = _directions(direction, w.fail)
    layout = int(w.attr("layout", 0))
    H = int(w.attr("hidden_size"))
    GH = gates * H
    S, NB = (w.c(proj.shape[1]), w.c(proj.shape[0])) if layout else (w.c(proj.shape[0]), w.c(proj.shape[1]))
    act = _Acts(_activation_functions(w, activation_specs(w.attr, cell, defaults, dirs, w.fail)), dirs,
                w.attr("clip"))
    if act.clip is not None:       # selects, not fminf/fmaxf (libm calls that keep a loop scalar)
        c = w.literal(act.clip, np.float32)
        w.statics += ["#pragma omp declare simd notinbranch",
                      f"static inline float ts_clip(float x) {{ return x < -{c} ? -{c} : (x > {c} ? {c} : x); }}"]
    w.statics += ["#include <omp.h>", PRODUCT_HELPER]
    ops = {"proj": proj, "rt": rt, "rb": w.arg(2) if w.has_arg(2) else None,
           "lens": w.arg(3) if w.has_arg(3) else None, "h0": w.arg(4) if w.has_arg(4) else None,
           "c0": w.arg(5) if cell == "LSTM" and w.has_arg(5) else None,
           "P": w.arg(6) if cell == "LSTM" and w.has_arg(6) else None,
           "y": w.out(0) if w.has_out(0) else None, "yh": w.out(1) if w.has_out(1) else None,
           "yc": w.out(2) if cell == "LSTM" and w.has_out(2) else None}
    geo = _Geometry(cell, H, GH, S, NB, dirs, layout, bool(w.attr("linear_before_reset", 0)),
                    {"forward": "0", "reverse": "1"}.get(direction, "(d == 1)"))
    w.emit(f"/* {cell} {direction}, layout {layout}: [{dirs} x {NB}] recurrences of up to {S} steps, hidden {H}, "
           f"{gates} gate(s); the input projections (+ biases) precomputed, R packed in panels of {PANEL} gate rows */")
    phases = _CELL_C[cell](w, act, ops, geo)
    if GH * H < SPLIT_MIN_MACS:
        _whole_recurrences(w, ops, geo, phases)
    else:
        _split_recurrences(w, ops, geo, phases)


@dataclass(frozen=True)
class _Geometry:
    cell: str
    H: int
    GH: int
    S: str          # the sequence length (C)
    NB: str         # the batch (C)
    dirs: int
    layout: int
    lbr: bool
    reverse: str    # whether direction d runs backwards (C)

    @property
    def gates(self) -> int:
        return self.GH // self.H

    @property
    def panels(self) -> int:
        """Panels of :data:`PANEL` gate rows per gate."""
        return -(-self.H // PANEL)

    @property
    def Hp(self) -> int:
        """A gate's rows in ``rec``, padded to whole panels (a product writes whole panels)."""
        return self.panels * PANEL

    def panel(self, gate: int, first: str = "0") -> str:
        """Where gate ``gate``'s panels start in the packed weight (from panel ``first``, C)."""
        return f"rt + ((d * {self.gates} + {gate}) * {self.panels} + {first}) * {self.H * PANEL}"

    @property
    def product_gates(self) -> int:
        """Gates whose recurrent product reads h (GRU's h gate without linear_before_reset reads r * h)."""
        return 2 if self.cell == "GRU" and not self.lbr else self.gates

    def state(self) -> str:
        return f"(b * {self.dirs} + d) * {self.H}" if self.layout else f"(d * ({self.NB}) + b) * {self.H}"

    def proj_row(self) -> str:
        return f"(b * ({self.S}) + pos)" if self.layout else f"(pos * ({self.NB}) + b)"

    def y_at(self, t: str) -> str:
        return f"((b * ({self.S}) + {t}) * {self.dirs} + d) * {self.H}" if self.layout else \
            f"(({t} * {self.dirs} + d) * ({self.NB}) + b) * {self.H}"


def _emit(w, indent: str, lines) -> None:
    for line in lines:
        w.emit(indent + line)


def _state_init(ops, geo: _Geometry, lo: str, hi: str, h: str, c: str, length: str) -> list[str]:
    """A batch entry's initial state over units [lo, hi) and zeros for its steps past ``length``."""
    lines = [f"for (int64_t i = {lo}; i < {hi}; ++i) {{",
             f"    {h}[i] = {ops['h0'].at(f'{geo.state()} + i') if ops['h0'] else '0.0f'};",
             f"    {c}[i] = {ops['c0'].at(f'{geo.state()} + i') if ops['c0'] else '0.0f'};",
             "}"]
    if ops["y"]:
        lines += [f"for (int64_t t = {length}; t < {geo.S}; ++t)     /* steps past the entry's length: zeros */",
                  f"    for (int64_t i = {lo}; i < {hi}; ++i) {ops['y'].at(geo.y_at('t') + ' + i')} = 0.0f;"]
    return lines


def _step_position(length: str) -> str:
    """The position step ``t`` of an entry of ``length`` steps reads and writes (reverse: from its end)."""
    return f"const int64_t pos = reverse ? {length} - 1 - t : t;"


def _step_inputs(ops, geo: _Geometry, length: str) -> list[str]:
    return [_step_position(length),
            f"const float *restrict g = &{ops['proj'].at(f'{geo.proj_row()} * {geo.dirs * geo.GH} + d * {geo.GH}')};"]


def _finals(ops, geo: _Geometry, lo: str, hi: str, h: str, c: str) -> list[str]:
    return [f"for (int64_t i = {lo}; i < {hi}; ++i) {out.at(f'{geo.state()} + i')} = {v}[i];"
            for out, v in ((ops["yh"], h), (ops["yc"], c)) if out]


def _whole_recurrences(w, ops, geo: _Geometry, phases) -> None:
    """Each (direction, batch entry) recurrence on one thread, in place; in parallel."""
    H, GH, lens = geo.H, geo.GH, ops["lens"]
    G, Hp = geo.gates, geo.Hp
    st = w.scratch("st", "float", f"{geo.dirs} * ({geo.NB}) * {2 * H + G * Hp + GH}")
    w.emit("/* whole recurrences per thread */")
    w.parallel_for([("d", str(geo.dirs)), ("b", geo.NB)], work=f"{geo.dirs} * ({geo.NB}) * ({geo.S}) * {GH} * {H}",
                   min_work=0)
    _emit(w, "    ", [
        f"float *restrict c = {st} + (d * ({geo.NB}) + b) * {2 * H + G * Hp + GH}, *restrict rec = c + {H}, "
        f"*restrict tmp = rec + {G * Hp};",
        f"float *h = tmp + {GH}, *hin = h, *hout = h;      /* the state updated in place */",
        f"const int64_t i0 = 0, i1 = {H};",
        f"const float *restrict rt = {ops['rt'].base};",
        f"const int64_t len = {w.count_check(lens.at('b'), geo.S, 3, 'b') if lens else geo.S};",
        f"const int reverse = {geo.reverse};",
        *_state_init(ops, geo, "0", str(H), "h", "c", "len"),
        "for (int64_t t = 0; t < len; ++t) {"])
    _emit(w, "        ", _step_inputs(ops, geo, "len"))
    for k in range(geo.product_gates):
        w.emit(f"        ts_product(rec + {k * Hp}, {geo.panel(k)}, {H * PANEL}, h, {H}, {geo.panels});")
    for n, phase in enumerate(phases):
        if n:       # GRU: the h gate's product over r * h
            w.emit(f"        ts_product(rec + {2 * Hp}, {geo.panel(2)}, {H * PANEL}, tmp + {2 * H}, {H}, {geo.panels});")
        _emit(w, "        ", phase)
    if ops["y"]:
        w.emit(f"        for (int64_t i = 0; i < {H}; ++i) {ops['y'].at(geo.y_at('pos') + ' + i')} = h[i];")
    w.emit("    }")
    _emit(w, "    ", _finals(ops, geo, "0", str(H), "h", "c"))
    w.emit("}")


def _split_recurrences(w, ops, geo: _Geometry, phases) -> None:
    """A direction at a time, every batch entry in lockstep, the team splitting the hidden units."""
    H, GH, NB, lens = geo.H, geo.GH, geo.NB, ops["lens"]
    G, Hp = geo.gates, geo.Hp
    st = w.scratch("st", "float", f"({NB}) * {3 * H + G * Hp + GH}")
    ln = w.scratch("ln", "int64_t", NB)
    w.emit("/* a direction at a time, the team splitting the hidden units, the batch entries in lockstep */")
    w.emit("int64_t steps = 0;")
    w.emit(f"for (int64_t b = 0; b < {NB}; ++b) {{")
    w.emit(f"    {ln}[b] = {w.count_check(lens.at('b'), geo.S, 3, 'b') if lens else geo.S};")
    w.emit(f"    steps = ts_max(steps, {ln}[b]);")
    w.emit("}")
    w.emit(f"for (int64_t d = 0; d < {geo.dirs}; ++d)")
    w.emit("#pragma omp parallel")
    w.emit("{")
    entry = [f"float *restrict rec = recs + b * {G * Hp}, *restrict tmp = tmps + b * {GH}, *restrict c = cs + b * {H};",
             f"const float *restrict hin = hc + b * {H};",
             f"float *restrict hout = hn + b * {H};"]
    _emit(w, "    ", [
        "const int64_t nt = omp_get_num_threads(), tid = omp_get_thread_num();",
        f"const int64_t chunks = ({H} + {SPLIT_CHUNK - 1}) / {SPLIT_CHUNK};",
        f"const int64_t i0 = ts_min(chunks * tid / nt * {SPLIT_CHUNK}, {H}), "
        f"i1 = ts_min(chunks * (tid + 1) / nt * {SPLIT_CHUNK}, {H});",
        f"float *cs = {st}, *hc = cs + ({NB}) * {H}, *hn = hc + ({NB}) * {H};   /* hc read, hn written: they alternate */",
        f"float *recs = hn + ({NB}) * {H}, *tmps = recs + ({NB}) * {G * Hp};",
        f"const float *restrict rt = {ops['rt'].base};",
        f"const int64_t pa = i0 / {PANEL}, pn = (i1 - i0 + {PANEL - 1}) / {PANEL};   /* this thread's panels */",
        f"const int reverse = {geo.reverse};",
        f"for (int64_t b = 0; b < {NB}; ++b) {{",
        *["    " + line for line in _state_init(ops, geo, "i0", "i1", f"(hc + b * {H})", f"(cs + b * {H})", f"{ln}[b]")],
        "}",
        "#pragma omp barrier",
        "for (int64_t t = 0; t < steps; ++t) {"])
    for k in range(geo.product_gates):
        w.emit(f"        ts_product_batch(recs + {k * Hp} + i0, {G * Hp}, {geo.panel(k, 'pa')}, {H * PANEL}, hc, {H}, "
               f"{H}, pn, {NB});")
    for n, phase in enumerate(phases):
        if n:       # GRU: every unit's r * h first, then the h gate's product over it
            w.emit("        #pragma omp barrier")
            w.emit(f"        ts_product_batch(recs + {2 * Hp} + i0, {G * Hp}, {geo.panel(2, 'pa')}, {H * PANEL}, "
                   f"tmps + {2 * H}, {GH}, {H}, pn, {NB});")
        w.emit(f"        for (int64_t b = 0; b < {NB}; ++b) {{")
        w.emit(f"            if (t >= {ln}[b]) continue;")
        _emit(w, "            ", entry + _step_inputs(ops, geo, f"{ln}[b]") + phase)
        w.emit("        }")
    w.emit(f"        for (int64_t b = 0; b < {NB}; ++b) {{")
    w.emit(f"            float *restrict hout = hn + b * {H};")
    w.emit(f"            if (t >= {ln}[b]) {{      /* past its length: the state carries over */")
    w.emit(f"                for (int64_t i = i0; i < i1; ++i) hout[i] = hc[b * {H} + i];")
    w.emit("                continue;")
    w.emit("            }")
    if ops["y"]:
        w.emit("            " + _step_position(f"{ln}[b]"))
        w.emit(f"            for (int64_t i = i0; i < i1; ++i) {ops['y'].at(geo.y_at('pos') + ' + i')} = hout[i];")
    w.emit("        }")
    w.emit("        { float *swap = hc; hc = hn; hn = swap; }")
    w.emit("        #pragma omp barrier")
    w.emit("    }")
    w.emit(f"    for (int64_t b = 0; b < {NB}; ++b) {{")
    _emit(w, "        ", _finals(ops, geo, "i0", "i1", f"(hc + b * {H})", f"(cs + b * {H})"))
    w.emit("    }")
    w.emit("}")


class _Loops:
    """The per-entry statements of one phase of a step: vectorized loops over the units
    ``i0..i1`` a thread updates (a whole recurrence: 0..H)."""

    def __init__(self):
        self.lines: list[str] = []

    def each(self, statement: str) -> None:
        self.lines += ["#pragma omp simd", f"for (int64_t i = i0; i < i1; ++i) {{ {statement} }}"]


def _rnn_cell_c(w, act, ops, geo: _Geometry) -> list[list[str]]:
    p = _Loops()
    p.each(f"hout[i] = {act(0, 'g[i] + rec[i]')};")
    return [p.lines]


def _gru_cell_c(w, act, ops, geo: _Geometry) -> list[list[str]]:
    """Gates z, r, h (ONNX order); without ``linear_before_reset`` the h gate's product reads
    ``r * h`` of every unit: a second phase after it (its recurrent bias already in the
    projections). One activation per loop: GCC if-converts a loop of one, not of several (the loop
    stayed scalar)."""
    H, Hp = geo.H, geo.Hp
    first, second = _Loops(), _Loops()
    first.each(f"tmp[i] = {act(0, 'g[i] + rec[i]')};   /* z */")
    r_h = "" if geo.lbr else f" tmp[{2 * H} + i] = tmp[{H} + i] * hin[i];   /* r * h */"
    first.each(f"tmp[{H} + i] = {act(0, f'g[{H} + i] + rec[{Hp} + i]')};   /* r */" + r_h)
    if geo.lbr:
        rb = ops["rb"]
        bias = f" + {rb.at(f'd * {H} + i')}" if rb else ""
        n = act(1, f"g[{2 * H} + i] + tmp[{H} + i] * (rec[{2 * Hp} + i]{bias})")
        last = first
    else:
        n = act(1, f"g[{2 * H} + i] + rec[{2 * Hp} + i]")
        last = second
    # n over rec's h rows: only this thread reads them (others may still read r * h)
    last.each(f"rec[{2 * Hp} + i] = {n};   /* n */")
    last.each(f"hout[i] = (1.0f - tmp[i]) * rec[{2 * Hp} + i] + tmp[i] * hin[i];")
    return [first.lines] if geo.lbr else [first.lines, second.lines]


def _lstm_cell_c(w, act, ops, geo: _Geometry) -> list[list[str]]:
    """Gates i, o, f, c (ONNX order); peepholes ``P`` (i, o, f) read the previous cell state for
    i and f, the new one for o. One activation per loop (see :func:`_gru_cell_c`)."""
    H, Hp, P = geo.H, geo.Hp, ops["P"]

    def peep(k):
        return f" + {P.at(f'd * {3 * H} + {k * H} + i')} * c[i]" if P else ""
    p = _Loops()
    p.each(f"tmp[i] = {act(0, 'g[i] + rec[i]' + peep(0))};   /* i */")
    if w.attr("input_forget", 0):
        p.each(f"tmp[{2 * H} + i] = 1.0f - tmp[i];   /* f: input_forget */")
    else:
        p.each(f"tmp[{2 * H} + i] = {act(0, f'g[{2 * H} + i] + rec[{2 * Hp} + i]' + peep(2))};   /* f */")
    p.each(f"tmp[{3 * H} + i] = {act(1, f'g[{3 * H} + i] + rec[{3 * Hp} + i]')};   /* candidate */")
    p.each(f"c[i] = tmp[{2 * H} + i] * c[i] + tmp[i] * tmp[{3 * H} + i];   /* the new cell state */")
    p.each(f"tmp[{H} + i] = {act(0, f'g[{H} + i] + rec[{Hp} + i]' + peep(1))};   /* o */")
    p.each(f"hout[i] = tmp[{H} + i] * {act(2, 'c[i]', clipped=False)};   /* the cell state unclipped, as onnxruntime */")
    return [p.lines]


_CELL_C = {"RNN": _rnn_cell_c, "GRU": _gru_cell_c, "LSTM": _lstm_cell_c}

for _op in CELLS:
    register(OpDef(_op, FusionClass.OPAQUE, recurrent_shape, recurrent_ref, arity=(3, 8 if _op == "LSTM" else 6)))
register(OpDef(RECURRENCE[1], FusionClass.OPAQUE, recurrence_shape, recurrence_ref, domain=RECURRENCE[0],
               arity=(2, 7), c_kernel=recurrence_c))

__all__ = ["ACTIVATIONS", "ACTIVATIONS_C", "CELLS", "RECURRENCE", "activation_specs", "recurrence_c",
           "recurrence_ref", "recurrence_shape", "recurrent_ref", "recurrent_shape"]
