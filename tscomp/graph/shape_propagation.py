"""Worklist-based symbolic shape propagation (TSCompiler §4.1, Algorithm 1).

Parameters (initializers) start static, graph inputs symbolic. A node becomes
*eligible* once every input it reads has a shape; eligible nodes go on a
worklist, and processing one runs its registry shape rule
(``ComputeSymShape``), then makes its successors eligible. Sibling inference
(``InferSibSymShape``) is realized through the shared :class:`SymbolTable`:
when a rule unifies two dimensions (MatMul's reduction dims, a broadcast of
two symbolic dims, Concat's non-axis dims), the substitution is global, so the
sibling's already-computed shapes read back in canonical form and the
constraint is recorded once.

Alongside shapes, propagation carries *values* where they are known at compile
time: constants are folded through the op's numpy reference, and small integer
tensors that hold shapes (Shape -> Gather -> Concat -> Reshape) carry their
elements as SymPy expressions via the op's data rule.
"""
from __future__ import annotations

from collections import deque

import numpy as np
import sympy

from tscomp.errors import ModelLoadError, ShapeError, TscompError, UnsupportedOperatorError
from tscomp.graph.ir import Graph, Node, Value
from tscomp.graph.ops import registry
from tscomp.graph.symbols import same
from tscomp.graph.ops.registry import DATA_VIA_REFERENCE, InputFacts, OpDef, ShapeContext

#: Fold constants only up to this many elements per output (weights transposed at
#: compile time are fine; a ConstantOfShape of a huge shape is not worth storing).
MAX_FOLD_ELEMENTS = 1 << 24
#: Shape-holding tensors carry symbolic elements only while they stay this small.
MAX_SYMDATA_ELEMENTS = 1024
#: ... and are computed only from constants this small (never from weight tensors).
MAX_SYMDATA_INPUT_ELEMENTS = 1 << 16


def propagate_shapes(graph: Graph) -> None:
    """Fill in dtype, shape, const and symdata of every value reachable from the inputs."""
    consumers = graph.consumers()
    processed: set[str] = set()
    queued: set[str] = set()
    worklist: deque[Node] = deque()

    def enqueue_if_eligible(node: Node) -> None:
        if node.name not in processed and node.name not in queued and _eligible(graph, node):
            worklist.append(node)
            queued.add(node.name)

    for node in graph.nodes:  # Alg. 1 lines 2-13: consumers of inputs/params, and source nodes
        enqueue_if_eligible(node)
    while worklist:  # Alg. 1 lines 14-31
        node = worklist.popleft()
        queued.discard(node.name)
        processed.add(node.name)
        if node.op_type == "If" and not node.domain:   # its condition is known now: the taken branch
            for new in splice_if(graph, node, consumers):   # joins the graph in its place
                enqueue_if_eligible(new)
            continue
        compute_node(graph, node)
        for out in node.outputs:
            for succ in consumers.get(out, ()):
                enqueue_if_eligible(succ)

    stuck = [n for n in graph.nodes if n.name not in processed]
    if stuck:
        n = stuck[0]
        missing = [i for i in n.inputs if i and graph.values[i].shape is None]
        raise ShapeError(f"{n.describe()}: never became ready; inputs without a shape: "
                         f"{', '.join(missing)} ({len(stuck)} nodes unprocessed)")
    canonicalize(graph)


def splice_if(graph: Graph, node: Node, consumers: dict) -> list[Node]:
    """Replace an ``If`` whose condition shape propagation has computed (a constant, or a shape
    expression the symbol ranges decide: TorchScript's ``squeeze(dim)`` asks ``dim == 1``) by its
    taken branch; returns the branch's nodes. A condition only run-time data decides is refused."""
    from tscomp.graph.onnx_import import taken_branch
    cond = graph.values[node.inputs[0]]
    flag = _decided_flag(graph, cond)
    if flag is None:
        raise UnsupportedOperatorError(
            f"{graph.source or 'model'}: If node {node.name!r}: its condition {cond.name!r} depends on "
            f"run-time data or on dimensions the declared ranges do not decide; tscomp compiles only the "
            f"branch a model takes at every shape in range")
    nodes, values = taken_branch(node, flag, graph.source or "model", graph.opset)
    for v in values:
        graph.values[v.name] = v
    for n in nodes:
        for out in n.outputs:
            if out:
                graph.values.setdefault(out, Value(out))
        for i in n.inputs:
            if i:
                if i not in graph.values:
                    raise ModelLoadError(f"{graph.source or 'model'}: {n.describe()} (If node {node.name!r}) "
                                         f"reads {i!r}, which nothing produces")
                consumers.setdefault(i, []).append(n)
    at = graph.nodes.index(node)
    graph.nodes[at:at + 1] = nodes
    return nodes


def _decided_flag(graph: Graph, cond) -> bool | None:
    """The boolean an If condition holds: from its constant, or from its shape expression where the
    symbol ranges decide it (``Eq(floor(h/2), 1)`` false over h in 4..24); None where neither."""
    if cond.const is not None and np.asarray(cond.const).size == 1:
        return bool(np.asarray(cond.const).reshape(-1)[0])
    data = cond.symdata
    if data is None or np.asarray(data).size != 1:
        return None
    expr = sympy.sympify(np.asarray(data, dtype=object).reshape(-1)[0])
    if expr.is_Number or expr in (sympy.true, sympy.false):
        return bool(expr)
    if isinstance(expr, sympy.core.relational.Relational):
        return graph.symbols.decide(expr.rel_op, expr.lhs, expr.rhs)
    return graph.symbols.decide("!=", expr, 0)


def _eligible(graph: Graph, node: Node) -> bool:
    return all(graph.values[i].shape is not None for i in node.inputs if i)


def compute_node(graph: Graph, node: Node) -> None:
    opdef = registry.lookup(node.op_type, node.domain, graph.opset_of(node), node.name)
    ctx = node_context(graph, node)
    _check_arity(opdef, ctx)
    _guarded(ctx, opdef.shape_rule, "shape rule")
    for i, out in enumerate(node.outputs):
        if out and ctx.out_shapes[i] is None:
            raise TscompError(f"{ctx.where()}: the shape rule produced no shape for output {i} ({out!r})")
    consts = _fold_constants(ctx, opdef, node)
    symdata = None if consts is not None else _propagate_data(ctx, opdef)
    for i, out in enumerate(node.outputs):
        if not out:
            continue
        v = graph.values[out]
        v.dtype, v.shape = ctx.out_dtypes[i], ctx.out_shapes[i]
        if consts is not None:
            v.const = consts[i]
        elif symdata is not None and symdata[i] is not None:
            concrete = registry.from_symbolic(symdata[i], v.dtype)
            if concrete is not None:
                v.const = concrete
            else:
                v.symdata = symdata[i]


def reduced_axes(graph: Graph, node: Node) -> list[int] | None:
    """The axes a reduction node reduces, as its registry entry says (``OpDef.reduced_axes``),
    or None when only run time knows them (or the op has no such rule)."""
    opdef = registry.lookup(node.op_type, node.domain, graph.opset_of(node), node.name)
    return None if opdef.reduced_axes is None else opdef.reduced_axes(node_context(graph, node))


def trailing_row_axes(shape, axes) -> list[int] | None:
    """``axes`` (sorted) with the unit axes after them, when together they are the trailing axes of
    ``shape`` -- the rows a row kernel reduces (ConvBERT's Softmax over [N, 9, 1]'s axis 1) --
    else None."""
    axes, rank = sorted(axes), len(shape)
    if not axes:
        return None
    after = range(axes[-1] + 1, rank)
    if all(same(shape[a], 1) for a in after):
        axes += list(after)
    return axes if axes == list(range(rank - len(axes), rank)) else None


def node_context(graph: Graph, node: Node) -> ShapeContext:
    """The facts a rule sees about ``node``: its inputs as propagation knows them."""
    facts = []
    for name in node.inputs:
        if not name:
            facts.append(None)
            continue
        v = graph.values[name]
        facts.append(InputFacts(name, v.dtype, v.shape, v.const, v.symdata))
    while facts and facts[-1] is None:  # trailing omitted optionals are simply absent
        facts.pop()
    return ShapeContext(node.name, node.op_type, node.attrs, graph.opset_of(node), facts,
                        len(node.outputs), graph.symbols)


def _check_arity(opdef: OpDef, ctx: ShapeContext) -> None:
    if opdef.arity is None:
        return
    lo, hi = opdef.arity
    n = len(ctx.inputs)
    if not lo <= n <= hi:
        ctx.fail(f"takes {lo}..{hi} inputs, got {n}")


def _guarded(ctx: ShapeContext, fn, what: str):
    """Run a rule; turn a crash inside it into an error that names the node."""
    try:
        return fn(ctx)
    except TscompError:
        raise
    except Exception as e:
        raise TscompError(f"{ctx.where()}: internal error in the {what} "
                          f"({type(e).__name__}: {e}); rerun with --debug for the traceback") from e


def _fold_constants(ctx: ShapeContext, opdef: OpDef, node: Node) -> list[np.ndarray | None] | None:
    present = [f for f in ctx.inputs if f is not None]
    if any(f.const is None for f in present) or opdef.fusion is registry.FusionClass.SHAPE:
        return None
    if node.op_type in NON_DETERMINISTIC:
        return None
    for shape in ctx.out_shapes:
        if shape is not None and not _small_concrete(shape, MAX_FOLD_ELEMENTS):
            return None
    inputs = [f.const if f is not None else None for f in ctx.inputs]
    outs = _guarded(ctx, lambda c: registry.run_reference(opdef, c.call, inputs), "reference implementation")
    result: list[np.ndarray | None] = []
    for i, arr in enumerate(outs[:ctx.num_outputs]):
        expected = tuple(int(d) for d in ctx.out_shapes[i])
        if tuple(arr.shape) != expected:
            raise TscompError(f"{ctx.where()}: shape rule says output {i} is {list(expected)} but the "
                              f"reference computes {list(arr.shape)} (tscomp bug)")
        # (np.ascontiguousarray would turn a 0-d result into shape [1])
        result.append(np.require(arr.astype(ctx.out_dtypes[i], copy=False), requirements="C"))
    return result


NON_DETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli"}


def _propagate_data(ctx: ShapeContext, opdef: OpDef) -> list[np.ndarray | None] | None:
    if opdef.data_rule is None:
        return None
    reads_values = opdef.fusion is not registry.FusionClass.SHAPE  # Shape/Size read only the input's shape
    if reads_values and any(f is not None and f.const is None and f.symdata is None for f in ctx.inputs):
        return None
    for shape in ctx.out_shapes:
        if shape is not None and not _small_concrete(shape, MAX_SYMDATA_ELEMENTS):
            return None
    if reads_values and any(f is not None and f.const is not None and f.const.size > MAX_SYMDATA_INPUT_ELEMENTS
                            for f in ctx.inputs):
        return None  # e.g. Gather from an embedding table: not shape arithmetic
    if opdef.data_rule == DATA_VIA_REFERENCE:
        inputs = [ctx.values(i) if ctx.has_input(i) else None for i in range(len(ctx.inputs))]
        try:
            outs = registry.run_reference(opdef, ctx.call, inputs)
        except (TypeError, ValueError, IndexError):
            return None  # symbolic indices, or a value the reference needs concrete
    else:
        outs = _guarded(ctx, opdef.data_rule, "data rule")
        if outs is None:
            return None
    result = []
    for i, arr in enumerate(list(outs)[:ctx.num_outputs]):
        if arr is None:
            result.append(None)
            continue
        arr = np.asarray(arr, dtype=object)
        expected = tuple(int(d) for d in ctx.out_shapes[i])
        if arr.shape != expected:
            raise TscompError(f"{ctx.where()}: data rule gives output {i} shape {list(arr.shape)}, "
                              f"shape rule says {list(expected)} (tscomp bug)")
        result.append(np.vectorize(lambda v: ctx.symbols.canon(sympy.sympify(v)), otypes=[object])(arr)
                      if arr.size else arr)
    return result


def _small_concrete(shape, limit: int) -> bool:
    if not all(getattr(d, "is_Integer", False) for d in shape):
        return False
    return int(np.prod([int(d) for d in shape], dtype=np.int64)) <= limit


def canonicalize(graph: Graph) -> None:
    """Rewrite every shape and symbolic element through the final substitution."""
    canon = graph.symbols.canon
    for v in graph.values.values():
        if v.shape is not None:
            v.shape = tuple(canon(d) for d in v.shape)
        if v.symdata is not None and v.symdata.size:
            v.symdata = np.vectorize(canon, otypes=[object])(v.symdata)


def unresolved_values(graph: Graph) -> list[str]:
    """Values whose shape is unknown or depends on a symbol nothing determines."""
    unknown = {info.symbol for info in graph.symbols.infos.values() if info.origin == "fresh"}
    out = []
    for name, v in graph.values.items():
        if v.shape is None or any(d.free_symbols & unknown for d in v.shape):
            out.append(name)
    return out
