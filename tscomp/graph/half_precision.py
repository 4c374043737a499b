"""float16 models computed in float32 (a graph-stage rewrite).

The kernel families generate float32 arithmetic; a float16 model (an export of ``model.half()``)
had every group on the numpy fallback. This rewrite keeps float16 where the model's user sees it --
its inputs and outputs -- and computes in float32 in between:

* a float16 constant becomes the float32 constant of the same values (exact);
* a float16 graph input is read through a ``Cast`` to float32;
* every operator with float16 operands reads their float32 forms and computes in float32; its
  float16 results become float32 values (``to`` / ``dtype`` / ``output_dtype`` attributes that name
  float16 name float32, a ``ConstantOfShape`` value is widened), read as they are by the next
  operator -- rounded to float16 only where the model says so: an explicit ``Cast`` to float16
  stays, and a float16 graph output is the float32 result cast to float16.

Why not round every operator's result to float16, as the types say: onnxruntime's CPU provider
does not either. It runs a float16 node with no float16 kernel as the float32 kernel between Casts
and removes the Cast pairs between consecutive such nodes, so its intermediate values are float32
too. Measured on tiny BERT (dynamo export of ``model.half()``), against the same model evaluated
in float32: this rewrite 2.1e-4 relative L2, onnxruntime 2.9e-4, rounding every result 6.6e-4.

The Casts are elementwise and fuse into their neighbours' kernels; the generated C reads and
writes float16 as ``_Float16`` (:data:`tscomp.graph.ops.registry.C_TYPES`). Nodes computed at
compile time are computed again from float32 operands (constant folding ran them in float16), so
a folded subgraph is not evaluated in float16 arithmetic either. The pass runs before the quantized
rewrite and before the folded nodes leave the graph.
"""
from __future__ import annotations

import numpy as np
from onnx import TensorProto

from tscomp.graph.ir import Graph, Node
from tscomp.graph.ops.registry import REGISTRY, OpCall, run_reference

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)

#: attributes that give an operator's result type (ONNX type codes): float16 becomes float32
TYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")


class _Rewrite:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.wide: dict[str, str] = {}        # float16 value -> its float32 form
        self.outputs = set(graph.outputs)
        self.nodes: list[Node] = []

    def is_half(self, name: str) -> bool:
        return bool(name) and self.graph.values[name].dtype == F16

    def widened(self, name: str) -> str:
        """The float32 form of a float16 value: a constant converted, a run-time value cast."""
        if name in self.wide:
            return self.wide[name]
        v = self.graph.values[name]
        if v.const is not None:
            out = self.graph.add_value(f"{name}/f32", F32, v.shape, np.asarray(v.const, F32))
        else:
            out = self.graph.add_value(f"{name}/f32", F32, v.shape)
            self.nodes.append(Node(f"{name}/to_float32", "Cast", [name], [out], {"to": TensorProto.FLOAT}))
        self.wide[name] = out
        return out

    def float16_result(self, computed: str, name: str) -> None:
        """``name``, a float16 result the rewritten node computes as the float32 ``computed``: its
        readers read ``computed``; a graph output is ``computed`` cast to float16."""
        self.wide[name] = computed
        if name in self.outputs:
            self.nodes.append(Node(f"{name}/to_float16", "Cast", [computed], [name], {"to": TensorProto.FLOAT16}))

    def node(self, node: Node) -> bool:
        """Append ``node``, rewritten to float32 when it touches float16; returns whether it did."""
        if not any(self.is_half(n) for n in node.inputs + node.outputs):
            self.nodes.append(node)
            return False
        if self.graph.folded(node):
            self.nodes.append(node)     # folded: it leaves the graph with the other folded nodes
            self.refold(node)
            return False
        node.inputs = [self.widened(i) if self.is_half(i) else i for i in node.inputs]
        if _rounds_to_half(node):
            self.nodes.append(node)     # the model's own rounding: kept, its readers widen the result
            return True
        node.attrs = _float32_attributes(node.attrs)
        computed = {o: self.graph.add_value(f"{o}/f32", F32, self.graph.values[o].shape)
                    for o in node.outputs if self.is_half(o)}
        node.outputs = [computed.get(o, o) for o in node.outputs]
        self.nodes.append(node)
        for name, result in computed.items():
            self.float16_result(result, name)
        return True

    def refold(self, node: Node) -> None:
        """A node computed at compile time (in float16, by constant folding): its float16 results
        computed again from float32 operands, as the run-time operators compute -- a weight-norm's
        ReduceL2 over a float16 weight summed in float16 put wav2vec2's output 8e-3 off. Where the
        reference cannot run on float32 operands the float16 constants stay (widened where read)."""
        values = self.graph.values
        halves = [o for o in node.outputs if self.is_half(o)]
        if not halves or any(i and values[i].const is None for i in node.inputs):
            return
        opdef = REGISTRY.get((node.domain or "", node.op_type))
        if opdef is None:
            return
        attrs = node.attrs if _rounds_to_half(node) else _float32_attributes(node.attrs)
        args = [values[self.widened(i) if self.is_half(i) else i].const if i else None for i in node.inputs]
        try:
            outs = run_reference(opdef, OpCall(node.name, node.op_type, attrs, self.graph.opset_of(node),
                                               len(node.outputs)), args)
        except Exception:  # noqa: BLE001 - the float16 constants folding computed stay
            return
        for name, arr in zip(node.outputs, outs):
            if name in halves and arr.dtype in (F16, F32) and arr.shape == values[name].const.shape:
                self.wide[name] = self.graph.add_value(f"{name}/f32", F32, values[name].shape, np.asarray(arr, F32))


def _rounds_to_half(node: Node) -> bool:
    """An explicit Cast to float16: the model's own rounding, which the rewrite keeps."""
    return node.op_type == "Cast" and not node.domain and node.attrs.get("to") == TensorProto.FLOAT16


def _float32_attributes(attrs: dict) -> dict:
    """``attrs`` with float16 named as float32: result types, a ConstantOfShape value."""
    return {k: _float32_attribute(k, v) for k, v in attrs.items()}


def _float32_attribute(key: str, value):
    if key in TYPE_ATTRIBUTES and value == TensorProto.FLOAT16:
        return TensorProto.FLOAT
    if key == "value" and isinstance(value, np.ndarray) and value.dtype == F16:    # ConstantOfShape
        return value.astype(F32)
    return value


def has_float16(graph: Graph) -> bool:
    """Whether the model has float16 tensors (this rewrite's work; its interface keeps them)."""
    return any(v.dtype == F16 for v in graph.values.values())


def float16_as_float32(graph: Graph) -> int:
    """Rewrite every operator with float16 operands or results to compute in float32 (see the
    module docstring); returns how many were rewritten."""
    if not has_float16(graph):
        return 0
    r = _Rewrite(graph)
    rewritten = sum(r.node(node) for node in list(graph.nodes))
    graph.nodes = r.nodes
    return rewritten


__all__ = ["float16_as_float32", "has_float16"]
