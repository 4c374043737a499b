"""Artifact writes are atomic (issue 12, item 4): a new artifact is written into a unique
temporary directory beside the target and swapped in by rename, so an interrupted or failing
write leaves the previous artifact loadable and no temporary directory behind, and concurrent
writers to one path end with one complete artifact."""
from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tscomp.compiler import compile_model
from tscomp.runtime import Runtime, artifact
from tscomp.runtime.artifact import write_artifact


def unary_model(tmp_path, op: str):
    """Compiled model of y = op(x) over x: float32[n, 3]."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name=op.lower())], op, [x], [y])
    path = tmp_path / f"{op}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return compile_model(str(path), ["n=1:17"])


X = np.linspace(-2, 2, 12, dtype=np.float32).reshape(4, 3)
EXPECT = {"Relu": np.maximum(X, 0), "Neg": -X}


def which(path) -> str:
    """Which of the two models the artifact at ``path`` holds (it must load and run)."""
    y = Runtime(path, warmup=False).run({"x": X})["y"]
    for op, want in EXPECT.items():
        if np.allclose(y, want):
            return op
    raise AssertionError(f"artifact at {path} computes neither model: {y}")


def leftovers(path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name and p.name.startswith(path.name))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return {op: unary_model(d, op) for op in EXPECT}


@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_interrupted_rewrite_keeps_previous_artifact_and_no_temp_dirs(models, tmp_path, monkeypatch, exc):
    out = tmp_path / "m.tsc"
    write_artifact(models["Relu"], out)

    def interrupted(*a, **k):
        raise exc("interrupted while writing")
    monkeypatch.setattr(artifact, "manifest_of", interrupted)
    with pytest.raises(exc):
        write_artifact(models["Neg"], out)
    assert which(out) == "Relu"
    assert leftovers(out) == []


def test_interrupted_first_write_leaves_nothing(models, tmp_path, monkeypatch):
    out = tmp_path / "m.tsc"
    monkeypatch.setattr(artifact, "manifest_of", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        write_artifact(models["Relu"], out)
    assert not out.exists() and leftovers(out) == []


def test_rewrite_replaces_previous_artifact(models, tmp_path):
    out = tmp_path / "m.tsc"
    write_artifact(models["Relu"], out)
    write_artifact(models["Neg"], out)
    assert which(out) == "Neg" and leftovers(out) == []


def test_refuses_to_overwrite_a_directory_that_is_not_an_artifact(models, tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "data.txt").write_text("keep me")
    with pytest.raises(artifact.ArtifactError, match="not a tscomp artifact"):
        write_artifact(models["Relu"], out)
    assert (out / "data.txt").read_text() == "keep me"


@pytest.mark.parametrize("exchange", ["renameat2", "two renames"])
def test_concurrent_writers_to_one_path_end_with_one_complete_artifact(models, tmp_path, monkeypatch, exchange):
    if exchange == "two renames":
        monkeypatch.setattr(artifact, "_exchange", lambda a, b: False)
    out = tmp_path / "m.tsc"
    write_artifact(models["Relu"], out)          # an old artifact to replace, too
    for _ in range(3):
        barrier = threading.Barrier(2)
        errors = []

        def write(op):
            try:
                barrier.wait()
                write_artifact(models[op], out)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)
        threads = [threading.Thread(target=write, args=(op,)) for op in ("Relu", "Neg")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert which(out) in EXPECT
        assert leftovers(out) == []
