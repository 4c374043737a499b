"""The command line: inspect output and one-line errors for bad input."""
import json
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tscomp.cli import main


def small_model(op="Relu"):
    x = helper.make_tensor_value_info("input_ids", TensorProto.FLOAT, ["batch", "sequence"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return helper.make_model(helper.make_graph([helper.make_node(op, ["input_ids"], ["y"], name="n0")],
                                               "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(small_model(), path)
    return path


def mlp_model():
    """MatMul + bias Add + Relu, then a second MatMul: two GEMM groups, the first with an epilogue.
    Weights are large enough to stay tensors in memory (small constants are inlined)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", 32])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
             for name, shape in (("w1", (32, 96)), ("b1", (96,)), ("w2", (96, 80)))]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    return helper.make_model(helper.make_graph(nodes, "mlp", [x], [y], inits),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


@pytest.fixture
def mlp_file(tmp_path):
    path = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), path)
    return path


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "tscomp.cli", *map(str, args)], capture_output=True, text=True)


def test_inspect_json_reports_symbols_values_and_unresolved(model_file, capsys):
    assert main(["inspect", str(model_file), "--dim", "sequence=1:512", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["symbols"]["sequence"] == {"min": 1, "max": 512, "origin": "user"}
    assert report["values"]["y"] == {"dtype": "float32", "shape": ["batch", "sequence"]}
    assert report["unresolved"] == []


def test_inspect_text_lists_symbols_and_shapes(model_file, capsys):
    assert main(["inspect", str(model_file)]) == 0
    out = capsys.readouterr().out
    assert "sequence: [1, 2147483647]" in out and "y: float32[batch, sequence]" in out


@pytest.mark.parametrize("case,expected", [
    ("truncated", "m.onnx: not a readable ONNX model"),
    ("unknown_op", "node 'n0': operator WeirdOp (opset 17) is not supported"),
    ("rank", "input 'input_ids' has rank 2, so axis 5 does not exist"),
    ("missing", "no such file"),
])
def test_bad_input_gives_one_line_error_and_nonzero_exit(tmp_path, case, expected):
    path = tmp_path / "m.onnx"
    args = []
    if case == "truncated":
        data = small_model().SerializeToString()
        path.write_bytes(data[: len(data) - 7])
    elif case == "unknown_op":
        onnx.save(small_model("WeirdOp"), path)
    elif case == "rank":
        onnx.save(small_model(), path)
        args = ["--dim", "L@input_ids:5=1:512"]
    result = run_cli("inspect", path, *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tscomp: error:"), result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


def test_debug_flag_shows_the_traceback(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(small_model("WeirdOp"), path)
    result = run_cli("--debug", "inspect", path)
    assert result.returncode != 0 and "Traceback" in result.stderr


# ----------------------------------------------------------------------------- --groups
GROUP_KEYS = {"name", "backbone", "ops", "inputs", "outputs"}


def test_inspect_groups_json_lists_the_fused_groups(mlp_file, capsys):
    assert main(["inspect", str(mlp_file), "--groups", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["values"]["y"]["shape"] == ["batch", "sequence", 80]  # the usual report is still there
    groups = report["groups"]
    assert len(groups) == 2 and all(GROUP_KEYS <= set(g) for g in groups)
    first, second = groups
    assert first["kind"] == second["kind"] == "gemm"
    assert first["backbone"] == second["backbone"] == "MatMul"
    assert first["ops"] == ["mm1", "bias", "relu"] and second["ops"] == ["mm2"]
    assert set(first["inputs"]) == {"x", "w1", "b1"} and first["outputs"] == ["r"]
    assert set(second["inputs"]) == {"r", "w2"} and second["outputs"] == ["y"]
    assert first["iteration_space"] == ["batch", "sequence", "96"]
    assert first["stages"] == {"prologue": [], "heavy": ["MatMul"], "epilogue": ["Add", "Relu"]}
    assert first["shapes"]["r"] == {"dtype": "float32", "shape": ["batch", "sequence", 96]}
    assert report["rewrites"] == []
    assert report["fusion"] == {"groups": 2, "compute_nodes": 4, "views_absorbed": 0}


def test_inspect_without_groups_has_no_fusion_keys(mlp_file, capsys):
    assert main(["inspect", str(mlp_file), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert not {"groups", "rewrites", "fusion"} & set(report)


def test_inspect_groups_text_lists_groups_rewrites_and_summary(mlp_file, capsys):
    assert main(["inspect", str(mlp_file), "--groups"]) == 0
    out = capsys.readouterr().out
    assert "y: float32[batch, sequence, 80]" in out  # the usual report comes first
    section = out[out.index("fusion groups"):]
    assert "g0_gemm [gemm] backbone=MatMul space=[batch, sequence, 96]" in section
    assert "ops:      mm1, bias, relu" in section and "epilogue: Add, Relu" in section
    assert "reads     x: float32[batch, sequence, 32]" in section
    assert "writes    r: float32[batch, sequence, 96]" in section
    assert "rewrites:\n  none" in section
    assert section.rstrip().endswith("fusion: 2 groups from 4 ONNX compute nodes (0 view nodes absorbed as index maps)")
    assert "picture" not in out


def test_inspect_groups_text_shows_horizontal_rewrites(tmp_path, capsys):
    """Two MatMuls on one activation (Q/K-style) are merged by the horizontal rewrite."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 32])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("q", "k")]
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((32, 48)).astype(np.float32), n) for n in ("wq", "wk")]
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"], name="q_proj"),
             helper.make_node("MatMul", ["x", "wk"], ["k"], name="k_proj")]
    path = tmp_path / "qk.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "qk", [x], outs, inits),
                                opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["inspect", str(path), "--groups"]) == 0
    out = capsys.readouterr().out
    assert "horizontal: q_proj, k_proj -> q_proj/hfused" in out
    assert "from 2 ONNX compute nodes" in out


def test_inspect_picture_png(mlp_file, tmp_path, capsys):
    picture = tmp_path / "plan.png"
    assert main(["inspect", str(mlp_file), "--groups", "--picture", str(picture)]) == 0
    assert f"picture: {picture}" in capsys.readouterr().out
    data = picture.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000


def test_inspect_picture_svg_keeps_json_on_stdout(mlp_file, tmp_path, capsys):
    picture = tmp_path / "plan.svg"
    assert main(["inspect", str(mlp_file), "--groups", "--json", "--picture", str(picture)]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)  # stdout is still exactly one JSON object
    assert report["picture"] == str(picture)
    assert f"picture: {picture}" in captured.err
    text = picture.read_text()
    assert "<svg" in text[:500] and "g0_gemm" in text and "[batch, sequence, 96]" in text


def test_inspect_without_picture_writes_none(mlp_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["inspect", str(mlp_file), "--groups"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mlp.onnx"]


@pytest.mark.parametrize("args,expected", [
    (["--picture", "plan.png"], "--picture draws the fused groups: add --groups"),
    (["--groups", "--picture", "plan.jpg"], "the file name must end in .png or .svg"),
    (["--groups", "--picture", "missing_dir/plan.png"], "no such directory"),
])
def test_bad_picture_argument_is_a_one_line_error(mlp_file, tmp_path, args, expected):
    result = subprocess.run([sys.executable, "-m", "tscomp.cli", "inspect", str(mlp_file), *args],
                            capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tscomp: error:") and expected in lines[0], result.stderr
    assert not any(p.suffix in (".png", ".jpg") for p in tmp_path.rglob("*"))


@pytest.mark.models
def test_inspect_groups_on_tiny_bert(exported_model, tmp_path):
    """End to end on a real export: every group has the documented keys, and the picture is drawn."""
    model = exported_model("bert", "tiny", "dynamo")
    picture = tmp_path / "bert.png"
    result = run_cli("inspect", model, "--dim", "batch=1:8", "--dim", "sequence=1:512", "--groups", "--json",
                     "--picture", picture)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    groups = report["groups"]
    assert groups and all(GROUP_KEYS <= set(g) for g in groups)
    assert any(g["backbone"] == "MatMul" for g in groups)
    assert report["rewrites"]  # BERT's Q/K/V projections are merged
    written = {o for g in groups for o in g["outputs"]}
    assert set(report["outputs"]) <= written
    assert report["nodes"]["after_simplification"] == (report["fusion"]["compute_nodes"]
                                                       + report["fusion"]["views_absorbed"])
    assert picture.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ compile / run / bench
def test_compile_then_run_prints_shapes_and_latency(mlp_file, tmp_path):
    out = tmp_path / "mlp.tsc"
    result = run_cli("compile", mlp_file, "--dim", "batch=1:4", "--dim", "sequence=1:64", "-o", out)
    assert result.returncode == 0, result.stderr
    assert "compiling groups [2/2]" in result.stderr          # progress
    assert f"wrote {out}" in result.stdout and "2 groups" in result.stdout
    assert (out / "manifest.json").is_file() and (out / "kernels.so").is_file()
    result = run_cli("run", out, "--shape", "sequence=37", "--shape", "batch=3", "--repeat", "3")
    assert result.returncode == 0, result.stderr
    assert "output y: float32[3, 37, 80]" in result.stdout
    assert "first call" in result.stdout and "steady" in result.stdout
    assert "native executor" in result.stdout
    assert "solo calls" in result.stdout                      # how a request after an idle pause runs
    result = run_cli("run", out, "--shape", "sequence=5", "--repeat", "1", "--executor", "python")
    assert result.returncode == 0 and "python executor" in result.stdout, result.stderr
    result = run_cli("run", out, "--device", "opencl")
    assert result.returncode == 1 and "cpu-target artifact" in result.stderr.strip().splitlines()[-1]


def test_run_errors_are_one_line(mlp_file, tmp_path):
    out = tmp_path / "mlp.tsc"
    assert run_cli("compile", mlp_file, "--dim", "batch=1:4", "--dim", "sequence=1:64", "-o", out).returncode == 0
    for args, expected in ((["--shape", "seq=3"], "no dimension 'seq'"),
                           (["--shape", "sequence=65"], "sequence = 65 (declared 1:64)"),
                           (["--shape", "sequence"], "expected NAME=VALUE")):
        result = run_cli("run", out, *args)
        assert result.returncode == 1
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], result.stderr
    result = run_cli("run", tmp_path / "missing.tsc")
    assert result.returncode == 1 and "no such artifact" in result.stderr


def test_bench_prints_a_ratio_table_and_writes_a_plot(mlp_file, tmp_path):
    art, plot = tmp_path / "mlp.tsc", tmp_path / "mlp.png"
    result = run_cli("bench", mlp_file, "--dim", "batch=1:4", "--dim", "sequence=1:64", "--samples", "3",
                     "--fix", "batch=2", "--threads", "1", "--artifact", art, "--plot", plot)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "onnxruntime ms" in lines[0] and "ratio" in lines[0] and "first/seen" in lines[0]
    assert len([ln for ln in lines if ln.split()[:1] == ["2"]]) == 3      # one row per sample, batch fixed
    assert "geomean" in result.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = run_cli("bench", mlp_file, "--dim", "batch=1:4", "--dim", "sequence=1:64", "--samples", "1",
                    "--threads", "1", "--artifact", art, "--plot", plot)
    assert again.returncode == 0 and "using the compiled artifact" in again.stderr


def test_bench_within_samples_inside_the_sub_range_and_refuses_one_outside_the_declared_range():
    from types import SimpleNamespace

    from tscomp.bench import sample_bindings
    from tscomp.cli_commands import parse_ranges
    from tscomp.errors import TscompError

    infos = [SimpleNamespace(name="batch", min=1, max=8), SimpleNamespace(name="sequence", min=1, max=512)]
    rt = SimpleNamespace(graph=SimpleNamespace(symbols=SimpleNamespace(live_symbols=lambda: infos)))
    got = sample_bindings(rt, 40, 0, {"batch": 1}, parse_ranges(["sequence=9:39"]))
    assert all(b["batch"] == 1 and 9 <= b["sequence"] <= 39 for b in got)
    assert len({b["sequence"] for b in got}) > 10
    with pytest.raises(TscompError, match="not inside the declared range"):
        sample_bindings(rt, 4, 0, {}, {"sequence": (0, 600)})
    with pytest.raises(TscompError, match="NAME=LO:HI"):
        parse_ranges(["sequence=39:9"])


def test_bench_refuses_to_draw_shapes_from_a_dimension_without_an_upper_bound():
    """A model compiled without --dim for an axis has it at 1:2^31-1; drawing from that allocated
    petabytes (an internal MemoryError). Now a clear error saying how to bound it; held or sampled
    within a sub-range, it is drawn as before."""
    from types import SimpleNamespace

    from tscomp.bench import sample_bindings
    from tscomp.errors import TscompError
    from tscomp.graph.symbols import DEFAULT_MAX

    infos = [SimpleNamespace(name="batch", min=1, max=DEFAULT_MAX), SimpleNamespace(name="height", min=1, max=DEFAULT_MAX)]
    rt = SimpleNamespace(graph=SimpleNamespace(symbols=SimpleNamespace(live_symbols=lambda: infos)))
    with pytest.raises(TscompError, match=r"'height' has no upper bound .*--fix height=N.*--within height=LO:HI"):
        sample_bindings(rt, 3, 0, {"batch": 1})
    got = sample_bindings(rt, 3, 0, {"batch": 1}, {"height": (8, 32)})
    assert all(b["batch"] == 1 and 8 <= b["height"] <= 32 for b in got)


def test_measure_gpu_is_refused_clearly_for_the_cpu_target_and_without_a_gpu(mlp_file, tmp_path):
    result = run_cli("compile", mlp_file, "--dim", "batch=1:8", "-o", tmp_path / "m.tsc", "--measure-gpu")
    assert result.returncode != 0 and "--measure-gpu times CUDA kernels: it needs --target cuda" in result.stderr
    from tscomp.runtime.device_opencl import DeviceError, device
    try:
        device("cuda")
        pytest.skip("a GPU is usable here: the refusal without one cannot be checked")
    except DeviceError:
        pass
    result = run_cli("compile", mlp_file, "--dim", "batch=1:8", "-o", tmp_path / "c.tsc", "--target", "cuda",
                     "--measure-gpu")
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and "device='cuda'" in lines[0], result.stderr


def test_compiling_a_float16_model_says_it_computes_in_float32(tmp_path):
    w = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float16)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "half",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["L", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "half.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    result = run_cli("compile", path, "--dim", "L=1:8", "-o", tmp_path / "half.tsc", "--no-tune")
    assert result.returncode == 0, result.stderr
    assert "float16 model: every operator computed in float32" in result.stdout
    result = run_cli("run", tmp_path / "half.tsc", "--shape", "L=3", "--repeat", "1")
    assert result.returncode == 0 and "output y: float16[3, 8]" in result.stdout, result.stdout + result.stderr


def test_compiling_a_quantized_model_names_its_gemms_on_integer_or_bf16_instructions(tmp_path):
    """A dynamically quantized linear layer with a symmetric int8 weight: its GEMM runs on AMX int8 tiles
    where the CPU has them, on int8 instructions where it has avx512_vnni (bf16 operands where it has
    avx512_bf16 only), and the
    compile summary says so; a CPU with neither runs it in fp32 and prints no such line."""
    from tscomp.schedule.target import host_cpu
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (32, 8)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.array(0.02, np.float32), "w_scale")]
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zp"]),
             helper.make_node("MatMulInteger", ["xq", "wq", "x_zp"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["acc_f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x_scale", "w_scale"], ["scale"]),
             helper.make_node("Mul", ["acc_f", "scale"], ["y"])]
    g = helper.make_graph(nodes, "dq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["L", 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    path = tmp_path / "dq.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    result = run_cli("compile", path, "--dim", "L=1:8", "-o", tmp_path / "dq.tsc", "--no-tune")
    assert result.returncode == 0, result.stderr
    spec = host_cpu().spec
    if spec.isa == "avx512" and spec.amx_int8:
        assert "quantized GEMMs and Convs: 1 gemm group(s) on AMX int8 tiles (TDPBUSD)" in result.stdout, result.stdout
    elif spec.isa == "avx512" and spec.vnni and not spec.amx:
        assert "quantized GEMMs and Convs: 1 gemm group(s) on int8 instructions (VPDPBUSD" in result.stdout, result.stdout
    elif spec.bf16:
        assert "quantized GEMMs and Convs: 1 gemm group(s) on bf16 operands" in result.stdout, result.stdout
    else:
        assert "quantized GEMMs" not in result.stdout
