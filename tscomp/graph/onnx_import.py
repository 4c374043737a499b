"""ONNX -> Graph IR.

Reads a model file (external-data files supported), converts initializers and
attributes to numpy, and gives every graph input a symbolic shape: ``dim_param``
names become symbols (sanitized: ``batch_size``, ``sequence_length``), the
user's ``--dim`` specifications rename and bound them, and dims with neither a
value nor a name become fresh symbols. Intermediate ``value_info`` from the
exporter is deliberately ignored: exporters fill it with junk dim names and
rank-only shapes (EXPORT-NOTES.md), so every shape is recomputed by
propagation.

Import also validates what onnxruntime validates, with one-line errors naming the node and the
value: every value has one producer (SSA: two nodes writing one name, or a node overwriting a
graph input or initializer, is refused), every node input is produced by something (dangling
references), and an ``If`` whose condition is a constant (an initializer or a ``Constant``) is
folded into its taken branch's nodes; an ``If`` on a computed condition stays as a node until shape
propagation knows the condition (TorchScript's ``squeeze(dim)`` of a dim its tracer could not see
asks ``Shape(x)[dim] == 1``: decided by the symbol ranges) and splices the taken branch in
(:func:`taken_branch`), or refuses it by name (other control flow is refused).
:func:`refuse_data_dependent_shapes` refuses, after shape propagation, an op whose output shape
depends on tensor data (NonZero, Unique, NonMaxSuppression, Compress of run-time data): the
reference executor runs them, the compiled kernels cannot.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
import sympy
from onnx import helper, numpy_helper

from tscomp.errors import DimSpecError, ModelLoadError, UnsupportedOperatorError
from tscomp.graph.dims import DimSpec
from tscomp.graph.functions import expand_functions, value_types
from tscomp.graph.ir import Graph, Node, Value
from tscomp.graph.symbols import DEFAULT_MAX, SymbolTable, sanitize_symbol_name


def read_model(path: str | os.PathLike) -> onnx.ModelProto:
    path = Path(path)
    if path.is_dir():
        raise ModelLoadError(f"{path}: is a directory, expected an .onnx file")
    if not path.is_file():
        raise ModelLoadError(f"{path}: no such file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf raises several unrelated types
        raise ModelLoadError(f"{path}: not a readable ONNX model (truncated or corrupt?): "
                             f"{type(e).__name__}: {_one_line(e)}") from e
    if not model.HasField("graph") or len(model.graph.node) == 0:
        raise ModelLoadError(f"{path}: the file parses but holds no ONNX graph (not an ONNX model?)")
    try:
        from onnx.external_data_helper import load_external_data_for_model
        load_external_data_for_model(model, str(path.parent))
    except Exception as e:
        raise ModelLoadError(f"{path}: cannot load external tensor data: {_one_line(e)}") from e
    return model


def import_model(model: onnx.ModelProto, dims: Sequence[DimSpec] = (), source: str = "<memory>") -> Graph:
    if len(model.functions):        # model-local functions (an exporter's modules as functions): inlined
        try:
            import onnx.inliner
            model = onnx.inliner.inline_local_functions(model)
        except Exception as e:  # noqa: BLE001
            raise UnsupportedOperatorError(
                f"{source}: model-local functions ({', '.join(f.name for f in model.functions)}) could not be "
                f"inlined: {_one_line(e)}") from e
    g = model.graph
    opset = {("" if o.domain in ("", "ai.onnx") else o.domain): o.version for o in model.opset_import}
    symbols = SymbolTable()
    values: dict[str, Value] = {}

    for init in g.initializer:
        try:
            values[init.name] = constant_value(init)
        except Exception as e:
            raise ModelLoadError(f"{source}: initializer {init.name!r} is unreadable: {_one_line(e)}") from e
    for sparse in g.sparse_initializer:
        raise UnsupportedOperatorError(f"{source}: sparse initializer {sparse.values.name!r} is not supported")

    runtime_inputs = [vi for vi in g.input if vi.name not in values]
    param_syms, axis_syms = _declare_input_symbols(runtime_inputs, dims, symbols)
    for vi in runtime_inputs:
        values[vi.name] = _input_value(vi, symbols, param_syms, axis_syms, source)

    onnx_nodes, branch_inits = _fold_constant_ifs(g, source)
    types = value_types(model) if any(_function_op(n, opset) for n, _ in onnx_nodes) else {}
    onnx_nodes = expand_functions(onnx_nodes, opset, types, _implemented)
    for init in branch_inits:
        values[init.name] = constant_value(init)
    nodes = []
    producer: dict[str, str] = {}
    for idx, (n, default_name) in enumerate(onnx_nodes):
        node = convert_node(n, n.name or default_name or f"{n.op_type}_{idx}", source)
        nodes.append(node)
        for out in n.output:
            if out:
                _check_single_producer(out, node, producer, values, source)
                values.setdefault(out, Value(out))
    for n in nodes:
        for i in n.inputs:
            if i and i not in values:
                raise ModelLoadError(f"{source}: {n.describe()} reads {i!r}, which nothing produces")
    outputs = [o.name for o in g.output]
    for o in outputs:
        if o not in values:
            raise ModelLoadError(f"{source}: graph output {o!r} is produced by no node")
    return Graph(g.name or Path(source).stem, nodes, values, [vi.name for vi in runtime_inputs],
                 outputs, symbols, opset, source)


def _implemented(op_type: str, domain: str, version: int) -> bool:
    """Whether the registry implements the operator at this opset (else a function body may)."""
    from tscomp.graph.ops.registry import REGISTRY
    opdef = REGISTRY.get((domain, op_type))
    return opdef is not None and opdef.opsets[0] <= version <= opdef.opsets[1]


def _function_op(node: onnx.NodeProto, opset: dict) -> bool:
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    return domain in opset and not _implemented(node.op_type, domain, opset[domain])


def convert_node(n: onnx.NodeProto, name: str, source: str) -> Node:
    attrs = {a.name: _attr_value(a, name, source, n.op_type) for a in n.attribute}
    return Node(name, n.op_type, list(n.input), list(n.output), attrs, n.domain)


def taken_branch(node: Node, flag: bool, source: str, opset: dict) -> tuple[list[Node], list[Value]]:
    """An ``If`` node decided ``flag``: the taken branch's nodes (its own constant Ifs folded, the
    others deferred again, its function operators expanded; named nodes prefixed with the If's
    name) and Identity nodes binding its outputs to the node's, and the branch's initializers as
    constant values."""
    _, inner, bindings, inits = _taken(node.name, node.attrs, node.outputs, flag, source, {})
    branch_name = "then_branch" if flag else "else_branch"
    inner = expand_functions(inner, opset, {}, _implemented)
    nodes = [convert_node(n, n.name and f"{node.name}/{branch_name}/{n.name}" or default, source)
             for n, default in inner]
    nodes += [convert_node(n, n.name, source) for n, _ in bindings]
    return nodes, [constant_value(init) for init in inits]


def constant_value(init: onnx.TensorProto) -> Value:
    """An initializer as a constant value of the graph."""
    arr = numpy_helper.to_array(init)
    return Value(init.name, arr.dtype, tuple(sympy.Integer(d) for d in arr.shape), const=arr)


# ---------------------------------------------------------------- input symbols
def _declare_input_symbols(inputs, dims: Sequence[DimSpec], symbols: SymbolTable):
    """Create one symbol per distinct dim_param, applying the user's --dim specs.

    Returns ``(dim_param -> symbol, (input, axis) -> symbol)``; the second map holds
    the unnamed axes a spec named by position.
    """
    params: dict[str, list[tuple[str, int]]] = {}
    by_name = {vi.name: vi for vi in inputs}
    for vi in inputs:
        for axis, d in enumerate(_dims_of(vi)):
            if d.HasField("dim_param") and d.dim_param:
                params.setdefault(d.dim_param, []).append((vi.name, axis))

    renames: dict[str, DimSpec] = {}  # dim_param -> spec naming it
    axis_specs: dict[tuple[str, int], DimSpec] = {}
    for spec in dims:
        if spec.input is not None:
            vi = by_name.get(spec.input)
            if vi is None:
                raise DimSpecError(f"--dim {spec.text}: the model has no input {spec.input!r} "
                                   f"(inputs: {', '.join(by_name) or 'none'})")
            rank = len(_dims_of(vi))
            if not -rank <= spec.axis < rank:
                raise DimSpecError(f"--dim {spec.text}: input {spec.input!r} has rank {rank}, "
                                   f"so axis {spec.axis} does not exist")
            axis = spec.axis % rank
            d = _dims_of(vi)[axis]
            if d.HasField("dim_value") and not (spec.min <= d.dim_value <= spec.max):
                raise DimSpecError(f"--dim {spec.text}: axis {axis} of input {spec.input!r} is static "
                                   f"({d.dim_value}), outside [{spec.min}, {spec.max}]")
            if d.HasField("dim_param") and d.dim_param:
                renames[d.dim_param] = spec
            else:
                axis_specs[(spec.input, axis)] = spec
        else:
            target = spec.param or spec.name
            match = target if target in params else next(
                (p for p in params if sanitize_symbol_name(p) == target), None)
            if match is None:
                known = ", ".join(f"{p} ({'/'.join(f'{i}:{a}' for i, a in locs)})"
                                  for p, locs in params.items()) or "none"
                raise DimSpecError(f"--dim {spec.text}: the model has no dynamic dimension named "
                                   f"{target!r}; its named dims are: {known}. "
                                   "Name an axis directly with NAME@INPUT:AXIS=MIN:MAX")
            renames[match] = spec

    _check_duplicate_names(dims)
    user_names = {spec.name: spec for spec in dims}
    param_syms = {}
    for param, locs in params.items():
        spec = renames.get(param)
        note = "axes " + ", ".join(f"{i}:{a}" for i, a in locs)
        if spec is None:
            name = sanitize_symbol_name(param)
            if name in user_names:
                raise DimSpecError(f"--dim {user_names[name].text}: {name!r} is already the name of the "
                                   f"model's dim_param {param!r}; choose another name")
            base, k = name, 2
            while name in symbols.infos:  # two dim_params that sanitize alike ('a b', 'a_b')
                name, k = f"{base}_{k}", k + 1
            param_syms[param] = symbols.new_symbol(name, origin="dim_param", note=note)
        else:
            param_syms[param] = _user_symbol(spec, symbols, f"{note} (dim_param {param!r})")
    axis_syms = {}
    for (inp, axis), spec in axis_specs.items():
        axis_syms[(inp, axis)] = _user_symbol(spec, symbols, f"axis {inp}:{axis}")
    for spec in dims:
        if spec.expr is not None:
            _derive(spec, symbols)
    return param_syms, axis_syms


def _user_symbol(spec: DimSpec, symbols: SymbolTable, note: str):
    if spec.expr is not None:   # its range follows from the expression's (see _derive)
        return symbols.new_symbol(spec.name, origin="user", min=0, note=f"{note} = {spec.expr}")
    return symbols.new_symbol(spec.name, origin="user", min=spec.min, max=spec.max, note=note, user_bounded=True)


def _derive(spec: DimSpec, symbols: SymbolTable) -> None:
    """``--dim total=past+sequence``: the dim is that expression of other dims, a fact the
    symbol table rewrites it into (so inputs are checked against it and drawn by it)."""
    names = set(re.findall(r"[A-Za-z_]\w*", spec.expr))
    unknown = sorted(n for n in names if n not in symbols.infos or n == spec.name)
    if unknown:
        raise DimSpecError(f"--dim {spec.text}: {', '.join(map(repr, unknown))} "
                           f"{'is not a dimension' if len(unknown) == 1 else 'are not dimensions'} "
                           f"of the model other than {spec.name!r} (dims: {', '.join(sorted(symbols.infos))})")
    try:        # names checked above; the grammar allows only + - * and parentheses besides them
        expr = sympy.sympify(spec.expr, locals={n: symbols.symbol(n) for n in names})
    except (sympy.SympifyError, SyntaxError, TypeError) as e:
        raise DimSpecError(f"--dim {spec.text}: {spec.expr!r} is not an expression of dims "
                           f"({type(e).__name__})") from None
    lo, hi = symbols.bounds(expr)
    if lo < 0:
        raise DimSpecError(f"--dim {spec.text}: {spec.expr} can be negative (as low as {int(lo)}), "
                           "which no dimension can be")
    reason = f"--dim {spec.text}"
    symbols.tighten(symbols.symbol(spec.name), int(lo), int(min(hi, DEFAULT_MAX)), reason)
    symbols.unify(symbols.symbol(spec.name), expr, reason)


def _check_duplicate_names(dims: Sequence[DimSpec]) -> None:
    seen = set()
    for spec in dims:
        if spec.name in seen:
            raise DimSpecError(f"--dim {spec.text}: symbol {spec.name!r} is specified twice")
        seen.add(spec.name)


def _input_value(vi, symbols: SymbolTable, param_syms: dict, axis_syms: dict, source: str) -> Value:
    tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if tt is None or not tt.elem_type:
        raise UnsupportedOperatorError(f"{source}: input {vi.name!r} is not a tensor (sequences, maps and "
                                       "optional inputs are not supported)")
    dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
    if not tt.HasField("shape"):
        raise DimSpecError(f"{source}: input {vi.name!r} has no declared rank; tscomp needs the rank "
                           "of every model input")
    shape = []
    for axis, d in enumerate(tt.shape.dim):
        if (vi.name, axis) in axis_syms:
            shape.append(axis_syms[(vi.name, axis)])
        elif d.HasField("dim_value"):
            shape.append(sympy.Integer(d.dim_value))
        elif d.HasField("dim_param") and d.dim_param:
            shape.append(param_syms[d.dim_param])
        else:
            shape.append(symbols.fresh_symbol(f"{sanitize_symbol_name(vi.name)}_dim{axis}",
                                              origin="input", note=f"unnamed axis {vi.name}:{axis}"))
    return Value(vi.name, dtype, tuple(shape))


def _dims_of(vi) -> list:
    tt = vi.type.tensor_type
    return list(tt.shape.dim) if tt.HasField("shape") else []


# ---------------------------------------------------------------- attributes
def _attr_value(a: onnx.AttributeProto, node_name: str, source: str, op_type: str = ""):
    if a.type == onnx.AttributeProto.GRAPH and op_type == "If":
        return a.g                 # a branch, spliced in or dropped by shape propagation
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        raise UnsupportedOperatorError(
            f"{source}: node {node_name!r} has a subgraph attribute {a.name!r} "
            "(control flow: If/Loop/Scan) which tscomp does not support")
    if a.ref_attr_name:
        raise UnsupportedOperatorError(f"{source}: node {node_name!r} uses a function attribute reference")
    v = helper.get_attribute_value(a)
    if isinstance(v, onnx.TensorProto):
        return numpy_helper.to_array(v)
    if isinstance(v, bytes):
        return v.decode("utf-8", errors="replace")
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode("utf-8", errors="replace") for s in v]
    if isinstance(v, list) and v and isinstance(v[0], onnx.TensorProto):
        return [numpy_helper.to_array(t) for t in v]
    if isinstance(v, onnx.SparseTensorProto):
        raise UnsupportedOperatorError(f"{source}: node {node_name!r}: sparse tensor attribute {a.name!r}")
    return v


# ---------------------------------------------------------------- validation
def _check_single_producer(out: str, node: Node, producer: dict[str, str], values: dict, source: str) -> None:
    """SSA: ``out`` is written by ``node`` only (not a second node, graph input or initializer)."""
    if out in producer:
        raise ModelLoadError(f"{source}: value {out!r} is written by two nodes, {producer[out]!r} and "
                             f"{node.name!r} ({node.op_type}): an ONNX graph assigns each name once (SSA)")
    if out in values:
        what = "an initializer" if values[out].const is not None else "a graph input"
        raise ModelLoadError(f"{source}: {node.describe()} writes {out!r}, which is already {what} "
                             "(an ONNX graph assigns each name once)")
    producer[out] = node.name


def _constant_values(g: onnx.GraphProto) -> dict[str, onnx.TensorProto]:
    """Values of ``g`` known without running it: initializers and ``Constant`` node outputs."""
    known = {init.name: init for init in g.initializer}
    for n in g.node:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1:
            for a in n.attribute:
                if a.name == "value" and a.type == onnx.AttributeProto.TENSOR:
                    known[n.output[0]] = a.t
                elif a.name in ("value_int", "value_ints", "value_float", "value_floats"):
                    known[n.output[0]] = numpy_helper.from_array(np.asarray(helper.get_attribute_value(a)))
    return known


def _fold_constant_ifs(g: onnx.GraphProto, source: str, known=None, prefix: str = ""):
    """The nodes of ``g`` with every ``If`` whose condition is constant replaced by its taken
    branch's nodes (recursively) and Identity nodes binding the branch outputs to the ``If``'s
    outputs; plus the branches' initializers. Returns ``([(node, default name)], initializers)``.
    An ``If`` on a computed condition stays, its branches as attributes: shape propagation decides
    it once the condition's value is known (:func:`taken_branch`), or refuses it by name."""
    known = dict(_constant_values(g) if known is None else known)
    out, inits = [], []
    for idx, n in enumerate(g.node):
        name = n.name or f"{prefix}{n.op_type}_{idx}"
        if n.op_type != "If" or n.domain not in ("", "ai.onnx"):
            out.append((n, f"{prefix}{n.op_type}_{idx}"))
            continue
        cond = n.input[0] if n.input else ""
        if cond not in known:      # computed from shapes, perhaps: decided during shape propagation
            out.append((n, name))
            continue
        flag = numpy_helper.to_array(known[cond])
        if flag.size != 1:
            raise ModelLoadError(f"{source}: If node {name!r}: condition {cond!r} has {flag.size} elements, expected 1")
        branch, inner, bindings, inner_inits = _taken(name, {a.name: a.g for a in n.attribute}, list(n.output),
                                                      bool(flag.reshape(-1)[0]), source, known)
        out += inner + bindings
        inits += inner_inits
        known.update({o: known[b.name] for b, o in zip(branch.output, n.output) if b.name in known})
    return out, inits


def _taken(name: str, branches: dict, outputs: list[str], flag: bool, source: str, known: dict):
    """An If decided ``flag``: (the taken branch, its nodes with their own constant Ifs folded,
    Identity nodes binding its outputs to the If's ``outputs``, its initializers and theirs)."""
    branch_name = "then_branch" if flag else "else_branch"
    branch = branches.get(branch_name)
    if branch is None:
        raise ModelLoadError(f"{source}: If node {name!r} has no {branch_name}")
    if len(branch.output) != len(outputs):
        raise ModelLoadError(f"{source}: If node {name!r}: {branch_name} has {len(branch.output)} outputs, "
                             f"the node {len(outputs)}")
    inner, inits = _fold_constant_ifs(branch, source, {**known, **_constant_values(branch)},
                                      prefix=f"{name}/{branch_name}/")
    bindings = []
    for k, (b_out, n_out) in enumerate(zip(branch.output, outputs)):
        if n_out:
            ident = helper.make_node("Identity", [b_out.name], [n_out], name=f"{name}/{branch_name}/output{k}")
            bindings.append((ident, ident.name))
    return branch, inner, bindings, list(branch.initializer) + inits


def refuse_data_dependent_shapes(graph: Graph) -> None:
    """After shape propagation: refuse the first node whose output shape depends on tensor data
    (a ``data-dependent`` symbol no input of the node carries: NonZero, Unique,
    NonMaxSuppression, Compress of run-time data) — compiled kernels cannot size their outputs
    from data, so such a model would fail every run; better to say so at compile time."""
    def data_symbols(name: str) -> set:
        v = graph.values.get(name)
        if v is None or v.shape is None or v.const is not None:
            return set()
        syms = set()
        for d in v.shape:
            for s in sympy.sympify(d).free_symbols:
                info = graph.symbols.infos.get(s.name)
                if info is not None and info.origin == "data-dependent":
                    syms.add(s)
        return syms

    for node in graph.nodes:
        seen = set().union(*(data_symbols(i) for i in node.inputs if i))
        for o in node.outputs:
            new = data_symbols(o) - seen if o else set()
            if new:
                raise UnsupportedOperatorError(
                    f"{graph.source}: {node.op_type} node {node.name!r}: data-dependent output shape is not "
                    f"supported (output {o!r} has {', '.join(sorted(s.name for s in new))} elements decided "
                    "by the input data at run time)")


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:300] if text else type(e).__name__
