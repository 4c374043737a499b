"""Graph simplification after shape propagation.

* **Constant folding** happens during propagation (every node whose inputs are
  all constants runs its numpy reference once); here the folded nodes leave
  the graph and their outputs stay as constants.
* **Shape-subgraph folding**: after propagation, every value that holds a
  shape (Shape -> Gather -> Concat -> ...) carries its elements as SymPy
  expressions over the symbols, so the nodes computing it leave the compute
  graph too. Consumers such as Reshape read the expressions, evaluated at the
  run-time binding — shape arithmetic never runs as tensor code.
* **Identity/Dropout removal** (inference: Dropout is the identity), and of Casts to their input's own type.
* **Pad folding**: a zero-valued constant Pad of the spatial axes in front of a
  Conv becomes the Conv's own padding (TensorFlow-style "SAME" ports emit one
  before every Conv; TSCompiler Fig. 7 fuses pad + conv into one kernel), so
  the padded copy is never written.
* **BatchNormalization as Mul and Add**: with constant statistics, inference BN is the
  per-channel affine ``x * s + t`` (``s = scale / sqrt(var + eps)``, ``t = B - mean * s``, both
  shaped ``[C, 1, ..., 1]``), two elementwise ops every kernel family fuses (BN after a MatMul or
  alone ran on the numpy fallback: SwiftFormer's attention output).
* **Softmax over one element**: ``x * 0 + 1`` (``LogSoftmax``: ``x * 0``), exactly what the
  operator gives -- 1 (0) for a finite x, NaN for NaN and +-inf -- as elementwise ops (SwiftFormer
  normalizes [B, N, 1] attention weights over their last axis; the GEMM family's row pass has no
  single-column form).
* **GroupNorm rows keep the channel axis**: exporters spell GroupNorm as ``Reshape(x, [0, G, -1])
  -> InstanceNormalization -> Reshape`` back, then a per-channel affine; the rows ``[N, G, C/G *
  H * W]`` merge the channel remainder with the symbolic spatial extent, so a per-channel constant's
  index into them is a floor by a symbolic size no kernel family can store through. Reshaping to
  ``[N, G, C/G, H * W]`` instead normalizes the same elements (InstanceNormalization reduces every
  axis after the second) with ``C/G`` an axis of its own, and the row family compiles the group.
* **Einsum as MatMul**: a two-operand contraction becomes view operators around one MatMul
  (:mod:`tscomp.graph.einsum`), which the GEMM families compile.
* **3-D convolutions and pools on the 2-D kernels**: a rank-5 Conv as one 2-D Conv over its
  temporal taps unfolded into channels, a 3-D pool as two separable 2-D pools, a global pool of
  rank 5 as a 2-D one (:mod:`tscomp.graph.volumetric`).
* **Parallel convolutions merged**: ``Add(Conv(x, A), Conv(x, B))`` with constant kernels of the
  same input, strides, dilations and groups, whose taps line up (RepVGG-style branches: TextNet's
  3x3 + 3x1 + 1x3 on one input) is one Conv with the kernels summed, each zero-padded into the
  larger window: one pass over the input instead of one per branch, and no sum of their outputs.
* **Recurrences as projections**: an RNN / GRU / LSTM with constant weights becomes the MatMul of
  every step's input projection ``X Wᵀ`` plus the biases that can join it, then the internal
  ``tscomp.Recurrence`` op over those projections and R (packed here, once, in panels of gate rows)
  (:mod:`tscomp.graph.ops.recurrent`): the GEMM family computes the projections of all steps at
  once, the recurrence kernel only what must run step by step.
* **Quantized operators as arithmetic**: per-tensor Q/DQ, DynamicQuantizeLinear, and
  MatMulInteger / ConvInteger with a constant weight whose result is cast to float become the
  float arithmetic that reproduces them (:mod:`tscomp.graph.quantized_arithmetic`).
* **float16 computed in float32**: every operator with float16 operands computes in float32 and
  rounds its float16 results to float16 (:mod:`tscomp.graph.half_precision`); float16 stays at the
  graph's inputs and outputs.
* **CastLike as Cast**: ``CastLike(x, like)`` takes only ``like``'s element type, which shape
  propagation knows, so it becomes ``Cast(x, to=that type)``: one input, as the elementwise
  families expect of a cast (the bodies of opset 23's ``Attention`` and ``RotaryEmbedding``
  functions cast with CastLike against whole score tensors, which read as a broadcast operand ran
  those groups on the numpy fallback).
* **Zeroed rows after the product**: ``MatMul(Where(c, 0, P), V)`` with ``c`` constant along
  ``P``'s last axis (extent 1 there) is ``Where(c, 0, MatMul(P, V))`` -- a zero row of ``P`` is a
  zero row of the product, and the row's other values, NaN included, never reach it. Opset 23's
  ``Attention`` body zeroes the probabilities of rows its mask blocks entirely ("safe softmax");
  with the ``Where`` after the product, the chain QKᵀ -> Softmax -> P·V closes again and compiles
  as one fused attention group.
* **Dead-node elimination**.

Compound operators: LayerNormalization, Softmax and Gelu are *kept* as
recognized compound ops rather than split into primitives. The fusion stage
treats each as one stitched reduction (or elementwise op), which is exactly
what splitting them would have to rediscover; their decomposed forms, which
the TorchScript exporter emits, are matched by the fusion stage instead.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import sympy

from tscomp.graph.einsum import lower_einsums
from tscomp.graph.half_precision import float16_as_float32
from tscomp.graph.ir import Graph, Node
from tscomp.graph.quantized_arithmetic import quantized_ops_as_arithmetic
from tscomp.graph.rewrite import replace_nodes
from tscomp.graph.volumetric import volumetric_as_planar

PASS_THROUGH_OPS = {"Identity", "Dropout"}


@dataclass
class SimplifyReport:
    folded: int = 0
    pass_through_removed: int = 0
    quantized_as_arithmetic: int = 0
    half_as_float32: int = 0
    pads_folded: int = 0
    batch_norms_as_affine: int = 0
    einsums_lowered: int = 0
    volumetric_as_planar: int = 0
    recurrences_split: int = 0
    convs_merged: int = 0
    group_norm_rows: int = 0
    unit_softmaxes: int = 0
    cast_likes: int = 0
    zeroed_rows_moved: int = 0
    dead_removed: int = 0

    def __str__(self) -> str:
        return (f"folded {self.folded} constant/shape nodes, removed {self.pass_through_removed} "
                f"Identity/Dropout/identity Casts, folded {self.pads_folded} Pads into Convs, rewrote "
                f"{self.batch_norms_as_affine} BatchNormalizations as Mul + Add, {self.einsums_lowered} Einsums as MatMuls, "
                f"{self.volumetric_as_planar} 3-D Convs and pools as 2-D ones, "
                f"{self.quantized_as_arithmetic} quantized operators as float arithmetic, "
                f"{self.half_as_float32} float16 operators in float32 and "
                f"{self.unit_softmaxes} one-element Softmaxes as x * 0 + 1, split {self.recurrences_split} "
                f"recurrences into projections + recurrence, merged {self.convs_merged} parallel Convs, "
                f"kept the channel axis in "
                f"{self.group_norm_rows} GroupNorm rows, rewrote {self.cast_likes} CastLikes as Casts, moved "
                f"{self.zeroed_rows_moved} row-zeroing Wheres after their MatMul, removed "
                f"{self.dead_removed} dead nodes")


def simplify(graph: Graph) -> SimplifyReport:
    report = SimplifyReport()
    report.half_as_float32 = float16_as_float32(graph)      # refolds folded float16 nodes in float32
    report.quantized_as_arithmetic = quantized_ops_as_arithmetic(graph)     # sees the folded weights' DQ
    report.folded = remove_folded_nodes(graph)
    report.cast_likes = cast_likes_as_casts(graph)
    report.pass_through_removed = remove_pass_through(graph)
    report.pads_folded = fold_pads_into_convs(graph)
    report.convs_merged = merge_parallel_convs(graph)
    report.batch_norms_as_affine = batch_norms_as_affine(graph)
    report.einsums_lowered = lower_einsums(graph)
    report.volumetric_as_planar = volumetric_as_planar(graph)
    report.unit_softmaxes = unit_softmaxes(graph)
    report.recurrences_split = recurrences_as_projections(graph)
    report.group_norm_rows = group_norm_rows(graph)
    report.zeroed_rows_moved = zeroed_rows_after_products(graph)
    report.dead_removed = eliminate_dead_nodes(graph)
    release_unused_constants(graph)
    return report


def cast_likes_as_casts(graph: Graph) -> int:
    """Every ``CastLike(x, like)`` as ``Cast(x, to=like's element type)`` (its ``saturate`` kept);
    of a constant ``x`` (folding left it: ``like`` is computed), the cast constant itself."""
    from onnx.helper import np_dtype_to_tensor_dtype
    count = 0
    nodes: list[Node] = []
    for n in graph.nodes:
        if n.op_type != "CastLike" or n.domain:
            nodes.append(n)
            continue
        like, x = graph.values[n.inputs[1]].dtype, graph.values[n.inputs[0]]
        count += 1
        if x.const is not None and x.const.dtype.kind in "biuf" and np.dtype(like).kind in "biuf":
            graph.values[n.outputs[0]].const = np.asarray(x.const).astype(like)
            continue
        n.op_type, n.inputs = "Cast", n.inputs[:1]
        n.attrs = {"to": int(np_dtype_to_tensor_dtype(np.dtype(like)))} | (
            {"saturate": n.attrs["saturate"]} if "saturate" in n.attrs else {})
        nodes.append(n)
    graph.nodes = nodes
    return count


def zeroed_rows_after_products(graph: Graph) -> int:
    """Every ``MatMul(Where(c, 0, P), V)`` whose condition is constant along ``P``'s last axis, whose
    Where only that MatMul reads, and whose V is a matrix (a vector V drops the product's last axis,
    which c's would then broadcast against), as ``Where(c, 0, MatMul(P, V))``."""
    producers, consumers = graph.producers(), graph.consumers()
    outputs = set(graph.outputs)
    moved: dict[str, Node] = {}        # MatMul name -> the Where emitted after it
    skip: set[str] = set()
    for node in graph.nodes:
        if node.op_type != "MatMul" or node.domain:
            continue
        where = producers.get(node.inputs[0])
        v = graph.values[node.inputs[1]].shape
        if where is None or v is None or len(v) < 2 or not _zeroes_whole_rows(graph, where) \
                or where.outputs[0] in outputs \
                or [c.name for c in consumers.get(where.outputs[0], [])] != [node.name]:
            continue
        out = graph.values[node.outputs[0]]
        product = graph.add_value(f"{node.name}/unzeroed", out.dtype, out.shape)
        moved[node.name] = Node(f"{where.name}/after_product", "Where",
                                [where.inputs[0], where.inputs[1], product], list(node.outputs))
        node.inputs = [where.inputs[2], node.inputs[1]]
        node.outputs = [product]
        skip.add(where.name)
    nodes: list[Node] = []
    for node in graph.nodes:
        if node.name in skip:
            continue
        nodes.append(node)
        if node.name in moved:
            nodes.append(moved[node.name])
    graph.nodes = nodes
    return len(moved)


def _zeroes_whole_rows(graph: Graph, where: Node) -> bool:
    """``where`` is ``Where(c, 0, P)`` with a scalar zero constant and ``c`` of extent 1 along
    ``P``'s last axis (absent there, or broadcast from 1)."""
    if where.op_type != "Where" or where.domain or len(where.inputs) != 3:
        return False
    zero = graph.values[where.inputs[1]].const
    if zero is None or np.asarray(zero).size != 1 or float(np.asarray(zero).reshape(-1)[0]) != 0.0:
        return False
    cond, p = graph.values[where.inputs[0]].shape, graph.values[where.inputs[2]].shape
    return cond is not None and p is not None and len(p) >= 2 and (not cond or cond[-1] == 1) \
        and len(cond) <= len(p)


def remove_folded_nodes(graph: Graph) -> int:
    keep = [n for n in graph.nodes if not graph.folded(n)]
    removed = len(graph.nodes) - len(keep)
    graph.nodes = keep
    return removed


def remove_pass_through(graph: Graph) -> int:
    outputs = set(graph.outputs)
    rename: dict[str, str] = {}
    keep: list[Node] = []
    for n in graph.nodes:
        if (n.op_type in PASS_THROUGH_OPS or _identity_cast(n, graph)) and n.outputs[0] not in outputs \
                and not _uses_dropout_mask(n, graph):
            src = n.inputs[0]
            rename[n.outputs[0]] = rename.get(src, src)
        else:
            keep.append(n)
    for n in keep:
        n.inputs = [_resolve(rename, i) for i in n.inputs]
    graph.nodes = keep
    return len(rename)


def _identity_cast(node: Node, graph: Graph) -> bool:
    """A Cast to its input's own element type (opset 23's Attention body casts every score tensor
    to the type it has)."""
    return (node.op_type == "Cast" and not node.domain
            and graph.values[node.inputs[0]].dtype == graph.values[node.outputs[0]].dtype)


def _resolve(rename: dict[str, str], name: str) -> str:
    while name in rename:
        name = rename[name]
    return name


def _uses_dropout_mask(node: Node, graph: Graph) -> bool:
    if len(node.outputs) < 2 or not node.outputs[1]:
        return False
    return node.outputs[1] in graph.outputs or any(node.outputs[1] in n.inputs for n in graph.nodes)


def fold_pads_into_convs(graph: Graph) -> int:
    """Give every Conv that reads a foldable Pad's output the Pad's input and the summed pads
    (the Pad itself leaves with dead-node elimination once nothing else reads it)."""
    producers = graph.producers()
    folded = 0
    for conv in graph.nodes:
        pad = producers.get(conv.inputs[0]) if conv.op_type == "Conv" and not conv.domain else None
        spatial = _foldable_spatial_pads(graph, pad) if pad is not None else None
        auto_pad = conv.attrs.get("auto_pad", "NOTSET")
        if spatial is None or auto_pad not in ("NOTSET", "VALID"):
            continue
        rank = len(spatial) // 2
        own = [0] * (2 * rank) if auto_pad == "VALID" else [int(p) for p in conv.attrs.get("pads", [0] * (2 * rank))]
        conv.attrs["pads"] = [a + b for a, b in zip(own, spatial)]
        conv.attrs["auto_pad"] = "NOTSET"
        conv.inputs[0] = pad.inputs[0]
        folded += 1
    return folded


def merge_parallel_convs(graph: Graph) -> int:
    """Replace ``Add(Conv_a(x), Conv_b(x))`` by one Conv whose kernel is the sum of both (each placed
    in the larger window where its taps read the same input positions) and whose bias is the sum
    of theirs, until no such pair is left (a three-branch sum merges twice)."""
    merged = 0
    while True:
        consumers, producers = graph.consumers(), graph.producers()
        pair = next(((add, m) for add in graph.nodes if add.op_type == "Add" and not add.domain
                     for m in [_mergeable_convs(graph, add, producers, consumers)] if m is not None), None)
        if pair is None:
            return merged
        add, (a, b, weight, bias, pads) = pair
        inputs = [a.inputs[0], graph.add_value(f"{add.name}/merged_weight", weight.dtype, weight.shape, weight)]
        if bias is not None:
            inputs.append(graph.add_value(f"{add.name}/merged_bias", bias.dtype, bias.shape, bias))
        attrs = {k: v for k, v in a.attrs.items() if k not in ("pads", "kernel_shape")}
        attrs.update(pads=pads, kernel_shape=list(weight.shape[2:]))
        conv = Node(f"{add.name}/merged_conv", "Conv", inputs, list(add.outputs), attrs)
        at = graph.nodes.index(add)
        graph.nodes[at] = conv
        graph.nodes = [n for n in graph.nodes if n is not a and n is not b]
        merged += 1


def _mergeable_convs(graph: Graph, add: Node, producers, consumers):
    """(conv a, conv b, merged kernel, merged bias, merged pads) when ``add`` sums two Convs that can be one."""
    convs = [producers.get(i) for i in add.inputs]
    if len(convs) != 2 or any(c is None or c.op_type != "Conv" or c.domain for c in convs) or convs[0] is convs[1]:
        return None
    a, b = convs
    if a.inputs[0] != b.inputs[0] or any(len(consumers.get(c.outputs[0], [])) != 1 or c.outputs[0] in graph.outputs
                                         for c in convs):
        return None
    if graph.values[a.outputs[0]].shape != graph.values[b.outputs[0]].shape:
        return None                      # an Add that broadcasts one branch is not a merged kernel
    weights = [graph.values[c.inputs[1]].const for c in convs]
    biases = [graph.values[c.inputs[2]].const if len(c.inputs) > 2 and c.inputs[2] else None for c in convs]
    if any(w is None for w in weights) or any(len(c.inputs) > 2 and c.inputs[2] and bb is None
                                             for c, bb in zip(convs, biases)):
        return None
    rank = weights[0].ndim - 2
    same = ("group", "strides", "dilations")
    defaults = {"group": 1, "strides": [1] * rank, "dilations": [1] * rank}
    if any(a.attrs.get(k, defaults[k]) != b.attrs.get(k, defaults[k]) for k in same) or \
            any(c.attrs.get("auto_pad", "NOTSET") != "NOTSET" for c in convs) or \
            weights[0].shape[:2] != weights[1].shape[:2] or weights[0].dtype != weights[1].dtype:
        return None
    dil = a.attrs.get("dilations", defaults["dilations"])
    pads = [list(c.attrs.get("pads", [0] * (2 * rank))) for c in convs]
    # per axis: the merged window starts at the larger begin pad; a kernel sits (begin - its begin) / d
    # taps in, and both must end on the same end pad for the outputs to have the same size
    begin = [max(p[ax] for p in pads) for ax in range(rank)]
    offsets, size, end = [], [], []
    for ax in range(rank):
        offs = [(begin[ax] - p[ax]) / dil[ax] for p in pads]
        if any(o != int(o) for o in offs):
            return None
        offs = [int(o) for o in offs]
        k = max(o + w.shape[2 + ax] for o, w in zip(offs, weights))
        ends = {p[rank + ax] + dil[ax] * (k - o - w.shape[2 + ax]) for o, w, p in zip(offs, weights, pads)}
        if len(ends) != 1:
            return None
        offsets.append(offs)
        size.append(k)
        end.append(ends.pop())
    merged = np.zeros(weights[0].shape[:2] + tuple(size), np.float64)
    for n, w in enumerate(weights):
        window = tuple(slice(offsets[ax][n], offsets[ax][n] + w.shape[2 + ax]) for ax in range(rank))
        merged[(slice(None), slice(None)) + window] += w
    kernel = merged.astype(weights[0].dtype)
    present = [bb for bb in biases if bb is not None]
    bias = np.sum([np.asarray(bb, np.float64) for bb in present], axis=0).astype(present[0].dtype) if present else None
    return a, b, kernel, bias, begin + end


def batch_norms_as_affine(graph: Graph) -> int:
    """Replace every inference BatchNormalization whose statistics are constants by ``Mul`` and
    ``Add`` with per-channel constants (computed in float64, stored in the input's dtype)."""
    rewritten = 0
    nodes: list[Node] = []
    for node in graph.nodes:
        params = [graph.values[i].const for i in node.inputs[1:5]] if node.op_type == "BatchNormalization" \
            and not node.domain and len(node.inputs) == 5 and len(node.outputs) == 1 else [None]
        if any(p is None for p in params):
            nodes.append(node)
            continue
        x = graph.values[node.inputs[0]]
        scale, bias, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
        s = scale / np.sqrt(var + float(node.attrs.get("epsilon", 1e-5)))
        per_channel = (len(s),) + (1,) * (len(x.shape) - 2)
        names = []
        for tag, arr in (("scale", s), ("shift", bias - mean * s)):
            arr = arr.astype(x.dtype).reshape(per_channel)
            names.append(graph.add_value(f"{node.name}/affine_{tag}", arr.dtype, arr.shape, arr))
        scaled = graph.add_value(f"{node.name}/affine_scaled", x.dtype, x.shape)
        nodes += [Node(f"{node.name}/affine_mul", "Mul", [node.inputs[0], names[0]], [scaled]),
                  Node(f"{node.name}/affine_add", "Add", [scaled, names[1]], list(node.outputs))]
        rewritten += 1
    graph.nodes = nodes
    return rewritten


def recurrences_as_projections(graph: Graph) -> int:
    """Split every RNN / GRU / LSTM whose W, R (and B) are constants into ``MatMul(X, W_all)``
    (``W_all`` ``[input, dirs * gates * hidden]``: every direction's Wᵀ side by side), ``Add`` of
    the bias that can join the projections (Wb + Rb; GRU's h-gate Rb under ``linear_before_reset``
    multiplies with r and stays with the recurrence) and ``tscomp.Recurrence`` over the projections
    and R packed in panels of gate rows (:func:`~tscomp.graph.ops.recurrent.pack_recurrent_weight`)."""
    return replace_nodes(graph, _recurrence_split)


def _recurrence_split(graph: Graph, node: Node) -> list[Node] | None:
    from tscomp.graph.ops.recurrent import CELLS, RECURRENCE, pack_recurrent_weight
    if node.op_type not in CELLS or node.domain:
        return None
    ins = list(node.inputs) + [""] * (8 - len(node.inputs))
    consts = [graph.values[i].const if i else None for i in ins[1:4]]
    x = graph.values[ins[0]]
    if consts[0] is None or consts[1] is None or (ins[3] and consts[2] is None) or x.dtype != np.float32 \
            or x.shape is None or len(x.shape) != 3:
        return None
    W, R = (np.asarray(c, np.float32) for c in consts[:2])
    dirs, rows, hidden = R.shape
    B = np.asarray(consts[2], np.float32) if ins[3] else np.zeros((dirs, 2 * rows), np.float32)
    wb, rb = B[:, :rows], B[:, rows:].copy()
    lbr = node.op_type == "GRU" and bool(node.attrs.get("linear_before_reset", 0))
    kept = rb[:, 2 * hidden:].copy() if lbr else None       # r * (R_h h + Rb_h): stays with the recurrence
    if lbr:
        rb[:, 2 * hidden:] = 0
    stem = node.name
    w_all = graph.add_value(f"{stem}/projection_weight", np.float32, (W.shape[2], dirs * rows),
                            np.ascontiguousarray(W.transpose(2, 0, 1).reshape(W.shape[2], dirs * rows)))
    proj_shape = (x.shape[0], x.shape[1], sympy.Integer(dirs * rows))
    raw = graph.add_value(f"{stem}/projections_unbiased", np.float32, proj_shape)
    out = [Node(f"{stem}/projection", "MatMul", [ins[0], w_all], [raw])]
    proj = raw
    bias = (wb + rb).reshape(-1)
    if bias.any():
        b = graph.add_value(f"{stem}/projection_bias", np.float32, (dirs * rows,), bias)
        proj = graph.add_value(f"{stem}/projections", np.float32, proj_shape)
        out.append(Node(f"{stem}/projection_bias_add", "Add", [raw, b], [proj]))
    packed = pack_recurrent_weight(R)
    rt = graph.add_value(f"{stem}/recurrent_weight_packed", np.float32, packed.shape, packed)
    rbk = graph.add_value(f"{stem}/recurrent_bias", np.float32, (dirs, hidden), kept) if lbr and kept.any() else ""
    attrs = {k: v for k, v in node.attrs.items() if k != "hidden_size"}
    attrs.update(cell=node.op_type, hidden_size=int(hidden))
    out.append(Node(stem, RECURRENCE[1], [proj, rt, rbk, *ins[4:8 if node.op_type == "LSTM" else 6]],
                    list(node.outputs), attrs, RECURRENCE[0]))
    return out


def unit_softmaxes(graph: Graph) -> int:
    """Replace every Softmax / LogSoftmax that normalizes over a single element (axis extent 1;
    before opset 13, the flattened axes from ``axis`` on) by ``x * 0 (+ 1)``."""
    rewritten = 0
    nodes: list[Node] = []
    for node in graph.nodes:
        x = graph.values[node.inputs[0]] if node.op_type in ("Softmax", "LogSoftmax") and not node.domain else None
        if x is None or x.shape is None or not x.shape:
            nodes.append(node)
            continue
        rank = len(x.shape)
        axis = int(node.attrs.get("axis", -1 if graph.opset_of(node) >= 13 else 1)) % rank
        extents = x.shape[axis:] if graph.opset_of(node) < 13 else x.shape[axis:axis + 1]
        if sympy.Mul(*extents) != 1:
            nodes.append(node)
            continue
        const = {tag: graph.add_value(f"{node.name}/unit_{tag}", x.dtype, (), np.asarray(value, dtype=x.dtype))
                 for tag, value in (("zero", 0.0), ("one", 1.0))}
        if node.op_type == "LogSoftmax":
            nodes.append(Node(f"{node.name}/unit_mul", "Mul", [node.inputs[0], const["zero"]], list(node.outputs)))
        else:
            zeroed = graph.add_value(f"{node.name}/unit_zeroed", x.dtype, x.shape)
            nodes += [Node(f"{node.name}/unit_mul", "Mul", [node.inputs[0], const["zero"]], [zeroed]),
                      Node(f"{node.name}/unit_add", "Add", [zeroed, const["one"]], list(node.outputs))]
        rewritten += 1
    graph.nodes = nodes
    return rewritten


def group_norm_rows(graph: Graph) -> int:
    """Give every InstanceNormalization of ``Reshape(x, [N, G, -1])`` (x ``[N, C, spatial...]``, ``C``
    a constant multiple of ``G``) the rows ``[N, G, C/G, prod(spatial)]``: a Reshape of x to them,
    the normalization, and a Reshape to the original rows (views, composed into the kernels)."""
    producers, consumers = graph.producers(), graph.consumers()
    rewritten = 0
    nodes: list[Node] = []
    for node in graph.nodes:
        split = _group_norm_split(graph, node, producers)
        if split is None:
            nodes.append(node)
            continue
        x, groups, per_group = split
        rows = graph.values[node.inputs[0]]
        shape4 = (rows.shape[0], sympy.Integer(groups), sympy.Integer(per_group), sympy.Mul(*x.shape[2:]))
        target = graph.add_value(f"{node.name}/channel_rows_shape", np.int64, (4,),
                                 np.array([0, groups, per_group, -1], np.int64))
        rows4 = graph.add_value(f"{node.name}/channel_rows", rows.dtype, shape4)
        normed4 = graph.add_value(f"{node.name}/channel_rows_normalized", rows.dtype, shape4)
        nodes += [Node(f"{node.name}/channel_rows", "Reshape", [x.name, target], [rows4]),
                  Node(node.name, node.op_type, [rows4, *node.inputs[1:]], [normed4], dict(node.attrs), node.domain)]
        out = node.outputs[0]
        users = consumers.get(out, [])
        if out not in graph.outputs and users and all(u.op_type == "Reshape" and u.inputs[0] == out for u in users):
            for u in users:     # the reshape back to x's shape reads the 4-d rows directly: one view, no
                u.inputs[0] = normed4   # [N, G, C/G * H * W] between (its index a floor by a symbolic size)
        else:
            restore = graph.add_value(f"{node.name}/group_rows_shape", np.int64, (3,),
                                      np.array([0, groups, -1], np.int64))
            nodes.append(Node(f"{node.name}/group_rows", "Reshape", [normed4, restore], [out]))
        rewritten += 1
    graph.nodes = nodes
    return rewritten


def _group_norm_split(graph: Graph, node: Node, producers: dict) -> tuple | None:
    """(x, G, C / G) where ``node`` is an InstanceNormalization of ``Reshape(x, [N, G, -1])`` as above."""
    if node.op_type != "InstanceNormalization" or node.domain:
        return None
    reshape = producers.get(node.inputs[0])
    if reshape is None or reshape.op_type != "Reshape" or reshape.domain:
        return None
    x, rows = graph.values[reshape.inputs[0]], graph.values[node.inputs[0]]
    if x.shape is None or rows.shape is None or len(x.shape) < 3 or len(rows.shape) != 3:
        return None
    channels, groups = x.shape[1], rows.shape[1]
    if not (channels.is_Integer and groups.is_Integer) or rows.shape[0] != x.shape[0]:
        return None
    channels, groups = int(channels), int(groups)
    if groups < 1 or channels % groups or channels == groups:
        return None
    return x, groups, channels // groups


def _foldable_spatial_pads(graph: Graph, pad: Node) -> list[int] | None:
    """The Pad's [begin..., end...] over the spatial axes of an N, C, spatial... tensor when it
    pads with zeros by constant non-negative amounts and leaves N and C alone, else None."""
    if pad.op_type != "Pad" or pad.domain or pad.attrs.get("mode", "constant") != "constant":
        return None
    rank = graph.values[pad.inputs[0]].rank
    opset = graph.opset_of(pad)
    if opset < 11:
        pads, value = pad.attrs.get("pads", pad.attrs.get("paddings")), pad.attrs.get("value", 0.0)
        axes = None
    else:
        pads, value, axes = (_constant_ints(graph, pad, 1), _constant_scalar(graph, pad, 2),
                             _constant_ints(graph, pad, 3) if opset >= 18 else None)
        if len(pad.inputs) > 3 and pad.inputs[3] and axes is None:
            return None
    if pads is None or value is None or value != 0 or rank is None or rank < 3:
        return None
    axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    if len(pads) != 2 * len(axes) or min(pads) < 0:
        return None
    per_axis = {a: (pads[i], pads[i + len(axes)]) for i, a in enumerate(axes)}
    if any(per_axis.get(a, (0, 0)) != (0, 0) for a in (0, 1)):
        return None
    spatial = range(2, rank)
    return [per_axis.get(a, (0, 0))[0] for a in spatial] + [per_axis.get(a, (0, 0))[1] for a in spatial]


def _constant_ints(graph: Graph, node: Node, index: int) -> list[int] | None:
    if len(node.inputs) <= index or not node.inputs[index]:
        return None
    v = graph.values[node.inputs[index]]
    data = v.const if v.const is not None else v.symdata
    if data is None:
        return None
    try:
        return [int(x) for x in np.asarray(data).reshape(-1)]
    except TypeError:  # symbolic pads: not folded
        return None


def _constant_scalar(graph: Graph, node: Node, index: int) -> float | None:
    """The Pad's constant value: 0 when omitted, None when not a compile-time number."""
    if len(node.inputs) <= index or not node.inputs[index]:
        return 0.0
    const = graph.values[node.inputs[index]].const
    if const is None:
        return None
    return float(np.asarray(const).reshape(-1)[0]) if const.size else 0.0


def eliminate_dead_nodes(graph: Graph) -> int:
    needed = set(graph.outputs)
    keep_rev: list[Node] = []
    for n in reversed(graph.toposorted()):
        if any(o in needed for o in n.outputs if o):
            keep_rev.append(n)
            needed.update(i for i in n.inputs if i)
    removed = len(graph.nodes) - len(keep_rev)
    kept = {id(n) for n in keep_rev}
    graph.nodes = [n for n in graph.nodes if id(n) in kept]
    return removed


def release_unused_constants(graph: Graph) -> None:
    """Drop the arrays of constants nothing reads any more (their shapes stay for reports)."""
    used = set(graph.outputs) | {i for n in graph.nodes for i in n.inputs if i}
    for name, v in graph.values.items():
        if v.const is not None and name not in used and v.const.size > 1024:
            v.const = None
