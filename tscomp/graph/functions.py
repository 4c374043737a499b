"""ONNX function operators expanded into their definitions at import.

Many ONNX operators are *functions*: the standard defines them by a body of other operators
(``MeanVarianceNormalization``, ``AffineGrid``, ``Swish``, the window functions), or by a body built
from the node's attributes and input types (*context-dependent*: ``RMSNormalization``,
``RotaryEmbedding``, ``Attention``, ``GroupNormalization``, ``CenterCropPad``). An operator
tscomp's registry does not implement, whose schema at the model's opset has such a body, is
replaced by that body before anything else sees the graph -- the way onnxruntime runs the ones
it has no kernel for. The QOperator format's quantized operators (QLinearMatMul, onnxruntime's
QLinearAdd, ...), which have no body in the standard, take theirs from
:mod:`tscomp.graph.quantized_operators`. The body's operators are then imported, shape-propagated, fused and
compiled like any exported primitives (an RMSNormalization becomes the Mul / ReduceMean / Sqrt /
Div chain the row family fuses into one kernel).

Expansion renames the body's values into the node's namespace (formal inputs -> the node's
inputs, formal outputs -> its outputs, everything else ``<node>/<name>``), substitutes attribute
references (``ref_attr_name``) by the node's attribute or else the schema's default (a reference to
neither is dropped, as the standard says), and expands nested function operators in turn. A
context-dependent body needs the inputs' types: the element types and ranks ONNX's own type
inference gives (:func:`value_types`).
"""
from __future__ import annotations

from typing import Callable

import onnx
import onnx.defs

from tscomp.errors import UnsupportedOperatorError
from tscomp.graph import quantized_operators

#: nested expansions before giving up (a body that, expanded, contains itself)
MAX_DEPTH = 8


def value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Name -> TypeProto of every value ONNX's type inference can type (graph inputs,
    initializers, intermediate values): what context-dependent function bodies are built from."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - inference is a help here, never a reason to refuse the model
        inferred = model
    g = inferred.graph
    types = {vi.name: vi.type for vi in list(g.input) + list(g.value_info) + list(g.output)}
    for init in g.initializer:
        types[init.name] = onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims))
    return types


def expand_functions(nodes: list, opset: dict[str, int], types: dict[str, onnx.TypeProto],
                     implemented: Callable[[str, str, int], bool], depth: int = 0) -> list:
    """``[(NodeProto, default name)]`` with every node whose operator ``implemented`` denies but
    whose schema has a function body replaced by the body's nodes (recursively)."""
    out = []
    for node, default in nodes:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        version = opset.get(domain)
        body = None
        if version is not None and not implemented(node.op_type, domain, version):
            body = function_body(node, version, types) or quantized_operators.body(node, opset, types)
        if body is None:
            out.append((node, default))
            continue
        if depth >= MAX_DEPTH:
            raise UnsupportedOperatorError(f"node {node.name or default!r}: {node.op_type}'s function body nests "
                                           f"more than {MAX_DEPTH} levels of function operators")
        name = node.name or default
        inner = [(n, f"{name}/{n.op_type}_{k}") for k, n in enumerate(_instantiate(node, name, body, version))]
        types = {**types, **_body_types([n for n, _ in inner], types, opset)}   # for nested context bodies
        out += expand_functions(inner, opset, types, implemented, depth + 1)
    return out


def _body_types(nodes: list[onnx.NodeProto], types: dict, opset: dict[str, int]) -> dict[str, onnx.TypeProto]:
    """Types of the values an expanded body computes (ONNX type inference over the body alone, its
    outer inputs typed from ``types``): a nested context-dependent function needs its inputs'."""
    produced = {o for n in nodes for o in n.output if o}
    outer = sorted({i for n in nodes for i in n.input if i and i not in produced})
    if any(i not in types for i in outer):
        return {}
    graph = onnx.helper.make_graph(nodes, "body", [onnx.helper.make_value_info(i, types[i]) for i in outer], [])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opset.items()])
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001
        return {}
    return {vi.name: vi.type for vi in inferred.graph.value_info}


def _body_version(body_versions, version: int) -> int:
    """The opset of the body a model at opset ``version`` uses: the newest body at or below it (a
    schema lists a body per opset that changed it -- GroupNormalization's at 18 and 21 -- and asked
    at a later opset, 23, returns none)."""
    older = [v for v in body_versions if v <= version]
    return max(older) if older else version


def function_body(node: onnx.NodeProto, version: int, types: dict[str, onnx.TypeProto]) -> onnx.FunctionProto | None:
    """The operator's function body at opset ``version``: static, or built for this node and its
    input types; None where the schema has none (or its types are unknown)."""
    try:
        schema = onnx.defs.get_schema(node.op_type, version, node.domain or "")
    except onnx.defs.SchemaError:
        return None
    if schema.has_function:
        body = schema.get_function_with_opset_version(_body_version(schema.function_opset_versions, version)) \
            or schema.function_body
        if isinstance(body, bytes):
            parsed = onnx.FunctionProto()
            parsed.ParseFromString(body)
            body = parsed
        return body if body.node else None
    if not schema.has_context_dependent_function:
        return None
    input_types = []
    for name in node.input:
        if name and name not in types:
            return None
        input_types.append(types[name].SerializeToString() if name else onnx.TypeProto().SerializeToString())
    try:
        built = schema.get_context_dependent_function_with_opset_version(
            _body_version(schema.context_dependent_function_opset_versions, version), node.SerializeToString(),
            input_types)
    except Exception:  # noqa: BLE001 - the builder refuses this node (an unsupported attribute combination)
        return None
    if not built:
        return None
    body = onnx.FunctionProto()
    body.ParseFromString(built)
    return body if body.node else None


def _instantiate(node: onnx.NodeProto, name: str, body: onnx.FunctionProto, version: int) -> list[onnx.NodeProto]:
    """The body's nodes with the node's values and attributes in place of the formal ones."""
    rename = {formal: actual for formal, actual in zip(body.input, node.input)}
    rename.update({formal: "" for formal in list(body.input)[len(node.input):]})      # optional, not given
    rename.update({formal: actual for formal, actual in zip(body.output, node.output) if actual})
    attrs = {a.name: a for a in node.attribute}
    defaults = _attribute_defaults(node, version, body)
    nodes = []
    for k, inner in enumerate(body.node):
        if inner.op_type != "If" and any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                         for a in inner.attribute):
            raise UnsupportedOperatorError(f"node {name!r}: {node.op_type}'s function body has control flow "
                                           f"({inner.op_type}), which tscomp does not expand")
        new = onnx.NodeProto()
        new.CopyFrom(inner)
        _rename_node(new, f"{name}/{inner.name or inner.op_type + '_' + str(k)}", rename, name, attrs, defaults)
        nodes.append(new)
    return nodes


def _rename_node(n: onnx.NodeProto, new_name: str, rename: dict, prefix: str, attrs: dict, defaults: dict) -> None:
    """A body node, in place: its values renamed (:func:`_renamed`), its attribute references bound
    to the calling node's attribute or the default (a reference to neither is dropped), its If
    branches renamed alike (they read the body's values by name)."""
    n.name = new_name
    n.input[:] = [_renamed(v, rename, prefix) for v in n.input]
    n.output[:] = [_renamed(v, rename, prefix) for v in n.output]
    bound = []
    for a in n.attribute:
        if a.ref_attr_name:
            given = attrs.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
            if given is not None:
                bound.append(_copy_named(given, a.name))
            continue
        a = _copy_named(a, a.name)        # detached from the list cleared below
        if a.type == onnx.AttributeProto.GRAPH:      # an If's branch (decided during shape propagation)
            for k, inner in enumerate(a.g.node):
                _rename_node(inner, f"{prefix}/{a.g.name}/{inner.name or inner.op_type}_{k}", rename, prefix,
                             attrs, defaults)
            for vi in list(a.g.output) + list(a.g.input) + list(a.g.value_info):
                vi.name = _renamed(vi.name, rename, prefix)
            for init in a.g.initializer:
                init.name = _renamed(init.name, rename, prefix)
        bound.append(a)
    del n.attribute[:]
    n.attribute.extend(bound)


def _copy_named(attr: onnx.AttributeProto, name: str) -> onnx.AttributeProto:
    out = onnx.AttributeProto()
    out.CopyFrom(attr)
    out.name = name
    return out


def _renamed(value: str, rename: dict, prefix: str) -> str:
    if not value:
        return ""
    return rename[value] if value in rename else f"{prefix}/{value}"


def _attribute_defaults(node: onnx.NodeProto, version: int, body: onnx.FunctionProto) -> dict:
    """Attribute name -> default AttributeProto: the function's own, then the schema's."""
    out = {a.name: a for a in body.attribute_proto}
    try:
        schema = onnx.defs.get_schema(node.op_type, version, node.domain or "")
    except onnx.defs.SchemaError:
        return out
    for key, attr in schema.attributes.items():
        if key not in out and attr.default_value is not None and attr.default_value.type:
            out[key] = attr.default_value
    return out


__all__ = ["MAX_DEPTH", "expand_functions", "function_body", "value_types"]
