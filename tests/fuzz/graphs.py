"""Random small ONNX graphs for differential fuzzing against onnxruntime (issue 12).

:func:`graph_cases` is a hypothesis strategy drawing a :class:`GraphCase`: an ONNX model over
one or two symbolic dims (``n`` in 1..17, ``m`` in 1..9, named by ``dim_param``), a chain of 2–5
ops over the registered operators — elementwise chains with numpy broadcasting (Add/Mul/Sub/Div
against a second input or a constant; Relu/Tanh/Exp/Sigmoid/Erf/Neg/Abs), MatMul against
constant weights and between two activations, Gemm with transposes and bias, ReduceSum/Mean/Max
over random axes with and without keepdims, Reshape/Transpose/Slice/Concat/Gather (constant and
run-time indices), Softmax, LayerNormalization — and one to three bindings of the symbols inside
their ranges (1 included). Each case also knows how to make its input feeds.

Shapes are tracked per tensor as tuples of ``int`` (static) and ``str`` (symbolic: a symbol
name, or an expression such as ``"n*4"`` after a reshape) so only ops that are valid for the
shape are drawn; values stay in ranges where float32 results compare at 1e-4 (Exp only of
bounded values, Div only by constants in [0.5, 2]).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

#: symbolic dims and their declared ranges
SYMBOLS = {"n": (1, 17), "m": (1, 9)}
OPSET = 17
UNARY = ("Relu", "Tanh", "Sigmoid", "Erf", "Neg", "Abs", "Exp")
BINARY = ("Add", "Mul", "Sub", "Div")


@dataclass
class GraphCase:
    model: onnx.ModelProto
    inputs: dict[str, tuple]              # name -> (dtype, shape with symbol names)
    index_extent: dict[str, int]          # run-time index input -> extent of the axis it indexes
    bindings: list[dict[str, int]]
    seed: int
    ops: list[str] = field(default_factory=list)

    @property
    def dims(self) -> list[str]:
        used = sorted({d for _, shape in self.inputs.values() for d in shape if isinstance(d, str)})
        return [f"{s}={SYMBOLS[s][0]}:{SYMBOLS[s][1]}" for s in used]

    def feeds(self, binding: dict[str, int]) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        out = {}
        for name, (dtype, shape) in self.inputs.items():
            concrete = tuple(binding[d] if isinstance(d, str) else d for d in shape)
            if dtype == np.int64:
                d = self.index_extent[name]
                out[name] = rng.integers(-d, d, concrete).astype(np.int64)
            else:
                out[name] = rng.standard_normal(concrete).astype(np.float32)
        return out

    def describe(self) -> str:
        return f"ops {' -> '.join(self.ops)}; inputs {self.inputs}; bindings {self.bindings}"


class _Builder:
    """Grows one graph: tensors with tracked shapes, nodes, initializers, inputs."""

    def __init__(self, draw):
        self.draw = draw
        self.nodes, self.inits, self.inputs = [], [], {}
        self.index_extent: dict[str, int] = {}
        self.shapes: dict[str, tuple] = {}
        self.ops: list[str] = []
        self.k = itertools.count()
        self.rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))

    # ---------------------------------------------------------------- helpers
    def name(self, stem: str) -> str:
        return f"{stem}{next(self.k)}"

    def const(self, arr: np.ndarray, stem: str = "c") -> str:
        name = self.name(stem)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def node(self, op: str, inputs: list[str], shape: tuple, **attrs) -> str:
        out = self.name("t")
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(op.lower() + "_"), **attrs))
        self.shapes[out] = tuple(shape)
        self.ops.append(op)
        return out

    def add_input(self, shape: tuple, dtype=np.float32, stem: str = "x") -> str:
        name = self.name(stem)
        self.inputs[name] = (dtype, tuple(shape))
        self.shapes[name] = tuple(shape)
        return name

    def weights(self, shape, scale=1.0) -> np.ndarray:
        return (self.rng.standard_normal(shape) * scale).astype(np.float32)

    # ---------------------------------------------------------------- ops
    def unary(self, t: str) -> str:
        op = self.draw(st.sampled_from(UNARY))
        if op == "Exp":                               # bounded argument: exp of tanh
            t = self.node("Tanh", [t], self.shapes[t])
        return self.node(op, [t], self.shapes[t])

    def binary(self, t: str) -> str:
        op = self.draw(st.sampled_from(BINARY))
        shape = self.shapes[t]
        keep = self.draw(st.integers(0, len(shape)))        # trailing dims the other operand has
        other_shape = []
        for d in shape[len(shape) - keep:]:
            other_shape.append(d if self.draw(st.booleans()) else 1)
        if op == "Div" or self.draw(st.booleans()) or any(isinstance(d, str) and not d.isidentifier()
                                                          for d in other_shape):
            cshape = [d if isinstance(d, int) else 1 for d in other_shape]
            arr = self.rng.uniform(0.5, 2.0, cshape) if op == "Div" else self.weights(cshape)
            other = self.const(arr.astype(np.float32))
        else:
            other = self.add_input(tuple(other_shape), stem="y")
        args = [t, other] if op == "Div" or self.draw(st.booleans()) else [other, t]
        return self.node(op, args, broadcast(shape, other_shape))

    def matmul_const(self, t: str) -> str:
        shape = self.shapes[t]
        k = shape[-1]
        n = self.draw(st.integers(1, 8))
        w = self.const(self.weights((k, n), 1 / np.sqrt(k)), "w")
        return self.node("MatMul", [t, w], shape[:-1] + (n,))

    def matmul_self(self, t: str) -> str:
        shape = self.shapes[t]
        perm = list(range(len(shape) - 2)) + [len(shape) - 1, len(shape) - 2]
        tt = self.node("Transpose", [t], tuple(shape[p] for p in perm), perm=perm)
        return self.node("MatMul", [t, tt], shape[:-1] + (shape[-2],))

    def gemm(self, t: str) -> str:
        a, k = self.shapes[t]
        trans_a = isinstance(a, int) and self.draw(st.booleans())
        rows, k = (k, a) if trans_a else (a, k)
        n = self.draw(st.integers(1, 8))
        trans_b = self.draw(st.booleans())
        w = self.const(self.weights((n, k) if trans_b else (k, n), 1 / np.sqrt(k)), "w")
        inputs = [t, w]
        if self.draw(st.booleans()):
            inputs.append(self.const(self.weights((n,) if self.draw(st.booleans()) else (1, n)), "b"))
        alpha, beta = self.draw(st.sampled_from([1.0, 0.5])), self.draw(st.sampled_from([1.0, 2.0]))
        return self.node("Gemm", inputs, (rows, n), transA=int(trans_a), transB=int(trans_b), alpha=alpha, beta=beta)

    def reduce(self, t: str) -> str:
        shape = self.shapes[t]
        op = self.draw(st.sampled_from(["ReduceSum", "ReduceMean", "ReduceMax"]))
        axes = sorted(self.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape))))
        keep = self.draw(st.booleans())
        out = tuple(1 if i in axes else d for i, d in enumerate(shape)) if keep else \
            tuple(d for i, d in enumerate(shape) if i not in axes)
        signed = [a - len(shape) if self.draw(st.booleans()) else a for a in axes]
        if op == "ReduceSum":    # opset 13+: axes as an input
            return self.node(op, [t, self.const(np.array(signed, np.int64), "axes")], out, keepdims=int(keep))
        return self.node(op, [t], out, axes=signed, keepdims=int(keep))

    def reshape(self, t: str) -> str:
        shape = self.shapes[t]
        last = shape[-1]
        options = []
        if isinstance(last, int) and last in (4, 6, 8):
            options.append("split")
        if len(shape) >= 2 and isinstance(shape[-1], int) and isinstance(shape[-2], int):
            options.append("merge")
        if len(shape) >= 3 and isinstance(last, int):
            options.append("flatten")
        kind = self.draw(st.sampled_from(options)) if options else "split1"
        if kind == "split":
            f = self.draw(st.sampled_from([f for f in (2, last // 2) if last % f == 0]))
            target, out = [0] * (len(shape) - 1) + [f, last // f], shape[:-1] + (f, last // f)
        elif kind == "merge":
            target, out = [0] * (len(shape) - 2) + [shape[-2] * last], shape[:-2] + (shape[-2] * last,)
        elif kind == "flatten":
            lead = "*".join(str(d) for d in shape[:-1])
            target, out = [-1, last], (product(shape[:-1]) if all(isinstance(d, int) for d in shape[:-1]) else lead, last)
        else:                    # append a unit axis
            target, out = [0] * len(shape) + [1], shape + (1,)
        return self.node("Reshape", [t, self.const(np.array(target, np.int64), "shape")], out)

    def transpose(self, t: str) -> str:
        shape = self.shapes[t]
        perm = self.draw(st.permutations(range(len(shape))))
        return self.node("Transpose", [t], tuple(shape[p] for p in perm), perm=list(perm))

    def slice(self, t: str) -> str:
        shape = self.shapes[t]
        axis = self.draw(st.integers(0, len(shape) - 1))
        d = shape[axis]
        if isinstance(d, int):
            start = self.draw(st.integers(-d, d - 1))
            s0 = start % d
            step = self.draw(st.sampled_from([1, 2, -1]))
            if step > 0:
                end = self.draw(st.integers(s0 + 1, d))
                length = -(-(end - s0) // step)
            else:
                end = self.draw(st.integers(-1, s0 - 1))
                length = -(-(s0 - end) // -step)
                end = end if end >= 0 else -d - 1
            starts, ends, steps, extent = [start], [end], [step], length
        else:                    # a symbolic axis: the whole axis, forwards or reversed
            if self.draw(st.booleans()):
                starts, ends, steps = [0], [2 ** 62], [1]
            else:
                starts, ends, steps = [-1], [-(2 ** 62)], [-1]
            extent = d
        ins = [t, self.const(np.array(starts, np.int64), "st"), self.const(np.array(ends, np.int64), "en"),
               self.const(np.array([axis if self.draw(st.booleans()) else axis - len(shape)], np.int64), "ax"),
               self.const(np.array(steps, np.int64), "sp")]
        return self.node("Slice", ins, shape[:axis] + (extent,) + shape[axis + 1:])

    def concat(self, t: str) -> str:
        shape = self.shapes[t]
        axis = self.draw(st.integers(0, len(shape) - 1))
        other = self.unary(t)
        d = shape[axis]
        out_d = 2 * d if isinstance(d, int) else f"2*{d}"
        return self.node("Concat", [t, other] if self.draw(st.booleans()) else [other, t],
                         shape[:axis] + (out_d,) + shape[axis + 1:], axis=axis)

    def gather(self, t: str) -> str:
        shape = self.shapes[t]
        static = [i for i, d in enumerate(shape) if isinstance(d, int)]
        axis = self.draw(st.sampled_from(static))
        d = shape[axis]
        form = self.draw(st.sampled_from(["scalar", "vector", "input"] if not self.index_extent else
                                         ["scalar", "vector"]))
        if form == "scalar":
            idx, ishape = self.const(np.array(self.draw(st.integers(-d, d - 1)), np.int64), "i"), ()
        elif form == "vector":
            vals = self.draw(st.lists(st.integers(-d, d - 1), min_size=1, max_size=4))
            idx, ishape = self.const(np.array(vals, np.int64), "i"), (len(vals),)
        else:
            sym = self.draw(st.sampled_from(sorted(SYMBOLS)))
            idx, ishape = self.add_input((sym,), np.int64, stem="idx"), (sym,)
            self.index_extent[idx] = d
        axis_attr = axis if self.draw(st.booleans()) else axis - len(shape)
        return self.node("Gather", [t, idx], shape[:axis] + ishape + shape[axis + 1:], axis=axis_attr)

    def softmax(self, t: str) -> str:
        shape = self.shapes[t]
        axis = self.draw(st.integers(-len(shape), len(shape) - 1))
        return self.node("Softmax", [t], shape, axis=axis)

    def layer_norm(self, t: str) -> str:
        shape = self.shapes[t]
        d = shape[-1]
        ins = [t, self.const(self.weights((d,)) + 1, "g")]
        if self.draw(st.booleans()):
            ins.append(self.const(self.weights((d,)), "beta"))
        return self.node("LayerNormalization", ins, shape, axis=-1, epsilon=1e-5)

    # ---------------------------------------------------------------- choosing
    def applicable(self, t: str) -> list:
        shape = self.shapes[t]
        r = len(shape)
        ops = [self.unary, self.binary, self.softmax, self.reduce, self.reshape]
        if r >= 1 and isinstance(shape[-1], int):
            ops += [self.matmul_const, self.layer_norm]
        if r in (2, 3) and size_bound(shape) <= 17 * 9 * 8:
            ops.append(self.matmul_self)
        if r == 2 and isinstance(shape[-1], int):
            ops.append(self.gemm)
        if r >= 2:
            ops.append(self.transpose)
        ops.append(self.slice)
        if r <= 3:
            ops.append(self.concat)
        if any(isinstance(d, int) for d in shape) and r <= 3:
            ops.append(self.gather)
        return [op for op in ops if r >= 1]


def broadcast(a: tuple, b: tuple) -> tuple:
    r = max(len(a), len(b))
    a, b = (1,) * (r - len(a)) + tuple(a), (1,) * (r - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def product(dims) -> int:
    out = 1
    for d in dims:
        out *= d
    return out


def size_bound(shape) -> int:
    return product(SYMBOLS[d][1] if isinstance(d, str) and d in SYMBOLS else (d if isinstance(d, int) else 64)
                   for d in shape)


@st.composite
def graph_cases(draw, max_ops: int = 5) -> GraphCase:
    b = _Builder(draw)
    syms = draw(st.sampled_from([("n",), ("n", "m"), ("m", "n")]))
    rank = draw(st.integers(1, 3))
    shape = [draw(st.sampled_from([3, 4, 6, 8])) for _ in range(rank)]
    for s in syms[:rank]:
        shape[draw(st.integers(0, rank - 1))] = s
    if not any(isinstance(d, str) for d in shape):
        shape[0] = syms[0]
    t = b.add_input(tuple(shape))
    outputs = []
    for _ in range(draw(st.integers(2, max_ops))):
        ops = b.applicable(t)
        if not ops or len(b.shapes[t]) == 0:
            break
        t = draw(st.sampled_from(ops))(t)
        if draw(st.integers(0, 5)) == 0:
            outputs.append(t)
        if len(b.shapes[t]) == 0 or len(b.nodes) >= 2 * max_ops:
            break
    outputs = list(dict.fromkeys(outputs + [t]))
    inputs = [helper.make_tensor_value_info(name, TensorProto.INT64 if dt == np.int64 else TensorProto.FLOAT,
                                            list(shape)) for name, (dt, shape) in b.inputs.items()]
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = helper.make_graph(b.nodes, "fuzz", inputs, outs, initializer=b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    used = sorted({d for _, s in b.inputs.values() for d in s if isinstance(d, str)})
    binding = st.fixed_dictionaries({s: st.one_of(st.just(1), st.integers(*SYMBOLS[s])) for s in used})
    bindings = draw(st.lists(binding, min_size=1, max_size=3, unique_by=lambda x: tuple(sorted(x.items()))))
    return GraphCase(model, dict(b.inputs), dict(b.index_extent), bindings, draw(st.integers(0, 2 ** 16)), b.ops)
