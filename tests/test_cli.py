"""The command line: inspect output and one-line errors for bad input."""
import json
import subprocess
import sys

import onnx
import pytest
from onnx import TensorProto, helper

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
