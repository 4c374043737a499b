"""Two-operand Einsum contractions rewritten as view operators around one MatMul.

An ``Einsum`` node has no kernel family of its own: a group built on it ran on the numpy fallback
(XLNet's relative attention is eleven Einsums per layer: 2.6x onnxruntime's time, 17 numpy groups
on a 2-layer model). Every two-operand contraction without a diagonal or a label only one operand
sums over is a batched matrix product once its axes are arranged (an ellipsis is spelled out as
labels first), so this pass
(part of :func:`tscomp.graph.simplify.simplify`) replaces the node by

    Transpose -> [Reshape] -> [Unsqueeze] -> MatMul -> [Reshape] -> Transpose

(and a one-operand Einsum that only reorders its labels, XLNet's ``ijbn->bnij``, by a Transpose)
where every operator but the MatMul is a view the fusion stage composes into the kernels' index
maps (TSCompiler §4.2): nothing is copied, and the MatMul is compiled by the GEMM families (a
constant operand is the GEMM's prepacked weight, two activations the batched GEMM).

Labels are classed as in any einsum-to-GEMM lowering: *batch* (both operands and the output),
*contracted* (both operands, not the output), *free* (one operand and the output). An activation
operand keeps its free labels as separate axes -- all but the last become batch axes of the
MatMul, broadcast against size-1 axes of the other operand -- so no symbolic extent is ever
merged; contracted labels merge into K by ``Reshape(..., [0, ..., 0, -1])``. A constant operand
is rearranged at compile time into the ``[K, N]`` weight (its free labels merged into N, split
again after the MatMul by a Reshape with constant extents).
"""
from __future__ import annotations

import math

import numpy as np
import sympy

from tscomp.graph.ir import Graph, Node, Value
from tscomp.graph.ops.nn import parse_einsum
from tscomp.graph.rewrite import NodeRewrite, replace_nodes


def lower_einsums(graph: Graph) -> int:
    """Rewrite every two-operand Einsum that is a batched matrix product, and every one-operand
    permutation; returns how many."""
    return replace_nodes(graph, lambda g, node: _lowered(g, node) if node.op_type == "Einsum" and not node.domain
                         else None)


def _lowered(graph: Graph, node: Node) -> list[Node] | None:
    spec = parse_einsum(str(node.attrs.get("equation", "")))
    if len(node.inputs) == 1 and len(spec.inputs) == 1 and spec.output is not None:
        x = graph.values[node.inputs[0]]
        named = _ellipsis_named(spec.inputs, spec.output, (len(x.shape),)) if x.shape is not None else None
        return _permutation(named[0][0], named[1], node) if named is not None else None
    if len(node.inputs) != 2 or len(spec.inputs) != 2 or spec.output is None:
        return None
    a, b = (graph.values[i] for i in node.inputs)
    if a.shape is None or b.shape is None:
        return None
    named = _ellipsis_named(spec.inputs, spec.output, (len(a.shape), len(b.shape)))
    if named is None:
        return None
    (ta, tb), out = named
    terms = (ta, tb, out)
    if any(len(set(t)) != len(t) for t in terms):
        return None
    if len(ta) != len(a.shape) or len(tb) != len(b.shape) or a.dtype != b.dtype:
        return None
    if any(c not in tb and c not in out for c in ta) or any(c not in ta and c not in out for c in tb):
        return None          # a label one operand sums over alone: a reduction first, not a GEMM
    if any(c not in ta and c not in tb for c in out):
        return None
    sizes = dict(zip(ta, a.shape)) | dict(zip(tb, b.shape))
    if any(sympy.simplify(sizes[c] - d) != 0 for c, d in zip(ta, a.shape)):
        return None          # a label with two extents (einsum's broadcasting of 1s): not handled
    if a.const is not None and b.const is not None:
        return None          # both constant: folded during propagation already
    if a.const is not None:
        ta, tb, a, b = tb, ta, b, a                    # the constant as the right operand
    rewrite = _Rewrite(graph, node)
    if b.const is not None and not any(c in ta for c in tb if c in out):
        return rewrite.with_weight(a, ta, b, tb, out, sizes)
    return rewrite.batched(a, ta, b, tb, out, sizes)


def _ellipsis_named(terms: tuple[str, ...], out: str, ranks: tuple[int, ...]) -> tuple[tuple[str, ...], str] | None:
    """The equation with its ellipsis spelled out as labels of its own (LongT5's block-local
    attention: ``...qhd,...khd->...hqk`` over [batch, blocks, q, h, d]). The ellipsis stands for the
    operands' leading axes aligned from the right, as in numpy; an axis only the longer ellipsis has
    is a free label of that operand. None where a term's rank cannot match it."""
    if not any("." in t for t in terms):
        return terms, out
    spans = []
    for term, rank in zip(terms, ranks):
        span = rank - len(term.replace(".", ""))
        if span < 0 or (span and "." not in term) or term.count(".") > 1:
            return None
        spans.append(span if "." in term else 0)
    used = set("".join(terms) + out)
    fresh = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in used]
    width = max(spans)
    if width > len(fresh):
        return None
    labels = "".join(fresh[:width])
    named = tuple(t.replace(".", labels[width - span:]) for t, span in zip(terms, spans))
    return named, out.replace(".", labels)


def _permutation(term: str, out: str, node: Node) -> list[Node] | None:
    """``ijbn->bnij``: a one-operand Einsum whose output reorders its labels is a Transpose."""
    if "." in term + out or len(set(term)) != len(term) or sorted(term) != sorted(out):
        return None
    return [Node(f"{node.name}/einsum_perm", "Transpose", list(node.inputs), list(node.outputs),
                 {"perm": [term.index(c) for c in out]})]


class _Rewrite(NodeRewrite):
    """Emits the replacement nodes of one Einsum, naming values after it."""

    kind = "einsum"

    def transpose(self, x: str, term: str, order: str, sizes: dict, tag: str) -> str:
        if term == order:
            return x
        return self._emit("Transpose", [x], tag, [sizes[c] for c in order], {"perm": [term.index(c) for c in order]})

    def merge_trailing(self, x: str, shape: list, count: int, tag: str) -> tuple[str, list]:
        """``count`` trailing axes merged into one (``Reshape`` to ``[0, ..., 0, -1]``)."""
        if count == 1:
            return x, shape
        merged = shape[:len(shape) - count] + [sympy.Mul(*shape[len(shape) - count:])]
        target = self._ints(f"{tag}_shape", [0] * (len(shape) - count) + [-1])
        return self._emit("Reshape", [x, target], tag, merged), merged

    def finish(self, y: str, labels: str, out: str) -> list[Node]:
        """Transpose the MatMul's result (axes ``labels``) into the Einsum's output."""
        final = self.node.outputs[0]
        if labels == out:
            last = self.nodes[-1]
            last.outputs = [final]                     # the last node writes the Einsum's output
            del self.graph.values[y]
        else:
            self._emit("Transpose", [y], "out", None, {"perm": [labels.index(c) for c in out]}, out=final)
        return self.nodes

    # ------------------------------------------------------------------ the two forms
    def with_weight(self, a: Value, ta: str, b: Value, tb: str, out: str, sizes: dict) -> list[Node]:
        """``a`` an activation, ``b`` a constant without batch labels: Y[free_a..., N] = A[free_a...,
        K] . W[K, N] with W rearranged now; N split back into b's free labels by a Reshape."""
        contract = [c for c in ta if c in tb]
        free_a = [c for c in ta if c not in tb]
        free_b = [c for c in tb if c not in ta]
        order_a = "".join(free_a + contract)
        x = self.transpose(a.name, ta, order_a, sizes, "a_perm")
        x, xshape = self.merge_trailing(x, [sizes[c] for c in order_a], len(contract), "a_k")
        if not contract:
            x, xshape = self.unsqueeze(x, xshape, [len(xshape)], "a_k1")
        K = math.prod(int(sizes[c]) for c in contract) if contract else 1
        N = math.prod(int(sizes[c]) for c in free_b) if free_b else 1
        w = np.ascontiguousarray(np.transpose(b.const, [tb.index(c) for c in contract + free_b]).reshape(K, N))
        w_name = self._value("weight", w.shape, w, w.dtype)
        y = self._emit("MatMul", [x, w_name], "mm", xshape[:-1] + [sympy.Integer(N)])
        labels = "".join(free_a + free_b)
        if len(free_b) != 1:
            target = [0] * len(free_a) + [int(sizes[c]) for c in free_b]
            y = self._emit("Reshape", [y, self._ints("split_n", target)], "y_split",
                           [sizes[c] for c in labels])
        return self.finish(y, labels, out)

    def batched(self, a: Value, ta: str, b: Value, tb: str, out: str, sizes: dict) -> list[Node]:
        """Two operands (or a constant with batch labels): Y[batch..., fa..., fb..., M, N] =
        A[batch..., fa..., 1..., M, K] . B[batch..., 1..., fb..., K, N], where M and N are the last
        free label of each side (a size-1 axis where a side has none) and the others broadcast."""
        batch = [c for c in out if c in ta and c in tb]
        contract = [c for c in ta if c in tb and c not in out]
        free_a = [c for c in out if c in ta and c not in tb]
        free_b = [c for c in out if c in tb and c not in ta]
        fa, M = free_a[:-1], free_a[-1:]
        fb, N = free_b[:-1], free_b[-1:]
        # A: [batch, fa, M, contract] -> merge contract -> unsqueeze fb (and M, K where absent)
        order_a = "".join(batch + fa + M + contract)
        x = self.transpose(a.name, ta, order_a, sizes, "a_perm")
        xshape = [sizes[c] for c in order_a]
        x, xshape = self.merge_trailing(x, xshape, len(contract), "a_k") if contract else (x, xshape)
        nb, nfa = len(batch), len(fa)
        axes_a = list(range(nb + nfa, nb + nfa + len(fb)))
        if not M:
            axes_a.append(nb + nfa + len(fb))
        if not contract:
            axes_a.append(nb + nfa + len(fb) + 1)
        x, xshape = self.unsqueeze(x, xshape, axes_a, "a_unsq")
        # B: [batch, fb, contract, N] -> merge contract (K before N: moved last, merged, moved back)
        order_b = "".join(batch + fb + contract + N)
        if b.const is not None:
            arr = np.transpose(b.const, [tb.index(c) for c in order_b])
            kshape = [int(sizes[c]) for c in batch + fb]
            arr = arr.reshape(kshape + [math.prod(int(sizes[c]) for c in contract) if contract else 1]
                              + [int(sizes[N[0]]) if N else 1])
            z = self._value("b_const", arr.shape, np.ascontiguousarray(arr), arr.dtype)
            zshape = list(self.graph.values[z].shape)
            axes_b = list(range(nb, nb + nfa))
            z, zshape = self.unsqueeze(z, zshape, axes_b, "b_unsq")
        else:
            z = self.transpose(b.name, tb, "".join(batch + fb + N + contract), sizes, "b_perm")
            zshape = [sizes[c] for c in batch + fb + N + contract]
            z, zshape = self.merge_trailing(z, zshape, len(contract), "b_k") if contract else (z, zshape)
            if not N:
                z, zshape = self.unsqueeze(z, zshape, [len(zshape) - (1 if contract else 0)], "b_n1")
            if not contract:
                z, zshape = self.unsqueeze(z, zshape, [len(zshape)], "b_k1")
            # [.., N, K] -> [.., K, N]
            perm = list(range(len(zshape) - 2)) + [len(zshape) - 1, len(zshape) - 2]
            zt = self._emit("Transpose", [z], "b_kn", [zshape[p] for p in perm], {"perm": perm})
            z, zshape = zt, [zshape[p] for p in perm]
            z, zshape = self.unsqueeze(z, zshape, list(range(nb, nb + nfa)), "b_unsq")
        yshape = xshape[:-1] + [zshape[-1]]
        for i in range(len(yshape) - 2):                 # broadcast batch axes
            if yshape[i] == 1:
                yshape[i] = zshape[i]
        y = self._emit("MatMul", [x, z], "mm", yshape)
        labels = "".join(batch + fa + fb) + (M[0] if M else "") + (N[0] if N else "")
        dummies = [] if M else [len(yshape) - 2]
        if not N:
            dummies.append(len(yshape) - 1)
        y, _ = self.squeeze(y, yshape, dummies, "y_sq")
        return self.finish(y, labels, out)


__all__ = ["lower_einsums"]
