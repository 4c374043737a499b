"""The plan picture: ``draw_plan`` writes a PNG or an SVG of the fused groups, laid out in layers."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tscomp.graph import DimSpec, import_model, propagate_shapes, simplify
from tscomp.graph.fusion import fuse
from tscomp.graph.fusion.picture import draw_plan, group_label, layout

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def weight(name, *shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def plan_of(nodes, inits, outputs=("y",), width=32):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", width])
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs, inits),
                              opset_imports=[helper.make_opsetid("", 17)])
    graph = import_model(model, [DimSpec.parse("sequence=1:512")], source="test.onnx")
    propagate_shapes(graph)
    simplify(graph)
    return fuse(graph)


def residual_block_plan():
    """GEMM + bias + Relu, a second GEMM, a residual Add and LayerNorm (fused into the second
    GEMM), and a side branch (a Softmax) that only the graph output reads."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["m2"], name="mm2"),
             helper.make_node("Add", ["m2", "x"], ["res"], name="residual"),
             helper.make_node("LayerNormalization", ["res", "g", "b"], ["y"], name="ln", axis=-1),
             helper.make_node("Softmax", ["x"], ["s"], name="softmax", axis=-1)]
    inits = [weight("w1", 32, 96), weight("b1", 96), weight("w2", 96, 32, seed=1), weight("g", 32), weight("b", 32)]
    return plan_of(nodes, inits, outputs=("y", "s"))


def chain_plan(n_blocks):
    """A deep stack of Linear+Relu blocks: one GEMM group per block."""
    nodes, inits, prev = [], [], "x"
    for k in range(n_blocks):
        out = "y" if k == n_blocks - 1 else f"a{k}"
        nodes += [helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"], name=f"mm{k}"),
                  helper.make_node("Relu", [f"m{k}"], [out], name=f"relu{k}")]
        inits.append(weight(f"w{k}", 32, 32, seed=k))
        prev = out
    return plan_of(nodes, inits)


def png_size(path):
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    return struct.unpack(">II", data[16:24])


def test_png_is_written(tmp_path):
    plan = residual_block_plan()
    path = draw_plan(plan, tmp_path / "plan.png")
    assert path == tmp_path / "plan.png"
    width, height = png_size(path)
    assert width > 300 and height > 300


def test_svg_shows_groups_shapes_inputs_and_outputs(tmp_path):
    plan = residual_block_plan()
    text = draw_plan(plan, tmp_path / "plan.svg").read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    for g in plan.groups:
        assert g.name in text
    assert "[batch, sequence, 96]" in text       # the tensor between the two GEMMs
    assert ">x<" in text and ">y<" in text and ">s<" in text  # graph input and outputs
    assert "graph input" in text and "graph output" in text  # the legend


def test_bad_extension_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        draw_plan(residual_block_plan(), tmp_path / "plan.jpg")
    assert not (tmp_path / "plan.jpg").exists()


def test_group_label_names_kind_backbone_and_op_types():
    plan = residual_block_plan()
    gemm = next(g for g in plan.groups if "mm2" in g.nodes)
    name, head, *ops = group_label(gemm)
    assert name == gemm.name and head == "gemm · MatMul"
    assert " ".join(ops).startswith("MatMul LayerNorm")  # heavy ops, LayerNormalization abbreviated
    assert "→ Add" in " ".join(ops)


def elementwise_chain_plan(ops, scalar=None):
    nodes, prev = [], "x"
    for k, op in enumerate(ops):
        out = "y" if k == len(ops) - 1 else f"v{k}"
        nodes.append(helper.make_node(op, [prev, "c"] if scalar is not None else [prev], [out], name=f"n{k}"))
        prev = out
    inits = [numpy_helper.from_array(np.float32(scalar), "c")] if scalar is not None else []
    return plan_of(nodes, inits)


def test_group_label_counts_repeated_op_types():
    plan = elementwise_chain_plan(["Add", "Mul"] * 40, scalar=0.5)
    assert len(plan.groups) == 1
    assert group_label(plan.groups[0]) == [plan.groups[0].name, "elementwise", "Add×40 Mul×40"]


def test_group_label_wraps_then_summarizes_long_op_lists():
    from tscomp.graph.fusion.picture import MAX_OPS_CHARS

    ops = ["Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Erf", "Floor", "Ceil", "Sin", "Cos",
           "Softplus", "Softsign", "Round", "Reciprocal", "Sign"]
    plan = elementwise_chain_plan(ops)
    assert len(plan.groups) == 1
    _, _, *lines = group_label(plan.groups[0])
    assert len(lines) == 2 and lines[0].startswith("Abs Neg Relu")
    assert lines[1].endswith("more") and all(len(line) <= MAX_OPS_CHARS + len(" +NN more") for line in lines)
    shown = " ".join(lines).split()
    hidden = int(lines[1].split("+")[-1].split()[0])
    assert len([w for w in shown if w in ops]) + hidden == len(ops)


def test_layout_is_layered_top_to_bottom_without_overlaps():
    plan = residual_block_plan()
    nodes, edges, layers = layout(plan)
    for e in edges:  # every edge goes down, one layer per step through its lane
        path = [e.src, *e.route, e.dst]
        assert [nodes[k].layer for k in path] == list(range(nodes[e.src].layer, nodes[e.dst].layer + 1))
    for layer in layers:  # boxes of one layer are left to right and do not overlap
        for a, b in zip(layer, layer[1:]):
            assert nodes[a].x + nodes[a].w / 2 <= nodes[b].x - nodes[b].w / 2 + 1e-9
    assert {"in:x", "out:y", "out:s"} <= set(nodes)
    assert {f"g:{g.name}" for g in plan.groups} <= set(nodes)
    assert nodes["in:x"].layer < min(nodes[f"g:{g.name}"].layer for g in plan.groups)


def test_a_tensor_read_far_below_runs_down_one_shared_lane():
    """``x`` feeds the first block and is added back after the second and third: its two long
    edges share the placeholder in the layer both pass through (2 lane points, not 3)."""
    nodes, inits, prev = [], [], "x"
    for k in range(3):
        out = "y" if k == 2 else f"a{k}"
        nodes.append(helper.make_node("MatMul", [prev, f"w{k}"], [f"m{k}"], name=f"mm{k}"))
        nodes.append(helper.make_node("Add", [f"m{k}", "x"], [out], name=f"res{k}") if k else
                     helper.make_node("Relu", [f"m{k}"], [out], name=f"relu{k}"))
        inits.append(weight(f"w{k}", 32, 32, seed=k))
        prev = out
    plan = plan_of(nodes, inits)
    assert len(plan.groups) == 3
    nodes_, edges, _ = layout(plan)
    long_edges = [e for e in edges if e.src == "in:x" and e.route]
    assert len(long_edges) == 2
    lanes = {k for e in long_edges for k in e.route}
    assert len(lanes) == 2 and all(k.startswith("lane:in:x:") for k in lanes)


def test_large_plans_grow_in_height_up_to_the_pixel_cap(tmp_path):
    small, large = chain_plan(3), chain_plan(90)
    assert len(large.groups) >= 90
    draw_plan(large, tmp_path / "large.png")
    draw_plan(small, tmp_path / "small.png")
    h_small, h_large = png_size(tmp_path / "small.png")[1], png_size(tmp_path / "large.png")[1]
    assert h_large > 10 * h_small / 3 and h_large <= 32000  # 30x the layers, capped by MAX_PIXELS


def test_long_symbolic_shapes_wrap_after_a_comma():
    import sympy

    from tscomp.graph.fusion.picture import MAX_LABEL_CHARS, _dims
    from tscomp.graph.ir import Value

    h, w = sympy.symbols("height width", integer=True, positive=True)
    n = sympy.floor(h / 8) * sympy.floor(w / 8) + 1
    short = Value("v", np.dtype("float32"), (sympy.Symbol("batch"), sympy.Symbol("sequence"), sympy.Integer(384)))
    assert _dims(short) == "[batch, sequence, 384]"
    long = Value("m", np.dtype("bool"), (sympy.Symbol("batch"), sympy.Integer(4), n, n))
    lines = _dims(long).split("\n")
    assert len(lines) > 1 and lines[0].startswith("bool[batch, 4,") and lines[-1].endswith("]")
    assert all(len(line) <= MAX_LABEL_CHARS for line in lines)
    assert " ".join(lines) == "bool[" + ", ".join(str(d) for d in long.shape) + "]"
