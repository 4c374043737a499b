"""Decoders with an explicit KV cache (models.decoder_cache) compiled with an empty cache allowed
(``--dim past=0:N``) and the mask's length derived (``--dim total=past+sequence``): every step of a generation loop -- the prompt with nothing cached, then one
token at a time with the presents fed back -- matches onnxruntime."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO_ROOT, _require_export_extra, model_cache_dir

pytestmark = pytest.mark.models

PROMPT, LONGEST = 8, 40
DIMS = ["batch=1:4", f"sequence=1:{PROMPT}", f"past=0:{LONGEST}", "total=past+sequence"]   # the mask's length: derived
RTOL = ATOL = 1e-4


def _export(name: str):
    _require_export_extra()
    if os.environ.get("TSCOMP_SANITIZE"):   # torch's exporter aborts under libasan: export in a clean child
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TSCOMP_SANITIZE")}
        out = subprocess.run([sys.executable, "-m", "models.decoder_cache", name, "--exporter", "torchscript",
                              "-o", str(model_cache_dir())], env=env, capture_output=True, text=True, check=True,
                             cwd=REPO_ROOT)
        return out.stdout.strip().splitlines()[-1]
    from models.decoder_cache import export_decoder
    return str(export_decoder(name, "torchscript", model_cache_dir()))


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def decoder(request):
    """(onnxruntime session, tscomp Runtime, cache geometry) of one family's cached decoder."""
    import onnxruntime as ort

    from models.decoder_cache import CacheGeometry
    from tscomp.compiler import compile_model
    from tscomp.runtime import Runtime

    path = _export(request.param)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    geometry = CacheGeometry.of_inputs(session.get_inputs())
    return session, Runtime.from_compiled(compile_model(path, DIMS)), geometry


def _assert_outputs_match(got: dict, want: list, session, where: str) -> None:
    for out, w in zip(session.get_outputs(), want):
        np.testing.assert_allclose(got[out.name], w, rtol=RTOL, atol=ATOL, err_msg=f"{out.name} at {where}")


@pytest.mark.parametrize("sequence, past", [(PROMPT, 0), (1, 0), (3, 0), (1, 1), (2, 1), (1, 2), (5, 13),
                                            (1, 37), (PROMPT, LONGEST - PROMPT + 1), (1, LONGEST)])
def test_a_step_with_any_cache_length_matches_onnxruntime_from_an_empty_cache_to_the_range_end(
        decoder, sequence, past):
    from models.decoder_cache import step_inputs
    session, rt, geometry = decoder
    feed = step_inputs(geometry, sequence, past, np.random.default_rng(sequence * 100 + past))
    got = rt.run(feed)
    assert got["present.0.key"].shape == (1, geometry.kv_heads, past + sequence, geometry.head_dim)
    _assert_outputs_match(got, session.run(None, feed), session, f"sequence={sequence} past={past}")


@pytest.mark.parametrize("sequence, past, padding", [(PROMPT, 0, (0, 3)), (5, 0, (4, 0, 2)), (1, 7, (0, 5)),
                                                     (1, 13, (0, 1, 2, 12)), (3, 37, (30, 0, 0, 1))])
def test_a_batch_of_left_padded_requests_matches_onnxruntime(decoder, sequence, past, padding):
    """Requests of different lengths served together: the shorter ones left-padded (their mask
    starts with zeros, a padded query row attends to nothing at the prompt step)."""
    from models.decoder_cache import step_inputs
    session, rt, geometry = decoder
    feed = step_inputs(geometry, sequence, past, np.random.default_rng(past), batch=len(padding), padding=padding)
    _assert_outputs_match(rt.run(feed), session.run(None, feed), session,
                          f"batch={len(padding)} sequence={sequence} past={past} padding={padding}")


def test_a_generation_loop_feeding_back_its_own_presents_matches_onnxruntime_at_every_step(decoder):
    from models.decoder_cache import next_step_inputs, output_names, step_inputs
    session, rt, geometry = decoder
    presents = output_names(geometry.layers)[1:]
    rng = np.random.default_rng(5)
    ours = theirs = step_inputs(geometry, PROMPT, 0, rng)
    for step in range(LONGEST - PROMPT + 1):     # the prompt, then one token at a time to the range end
        want = session.run(None, theirs)
        got = rt.run(ours)
        _assert_outputs_match(got, want, session, f"step {step} (past {theirs['attention_mask'].shape[1] - 1})")
        token = want[0][:, -1].argmax(-1).reshape(1, 1).astype(np.int64)   # onnxruntime's greedy choice
        theirs = next_step_inputs(theirs, want[1:], token)
        ours = next_step_inputs(ours, [got[n] for n in presents], token)
    assert ours["attention_mask"].shape[1] == LONGEST + 1


def test_a_mask_that_disagrees_with_the_cache_length_is_refused_by_the_derived_dim(decoder):
    """attention_mask covers past + sequence tokens (``--dim total=past+sequence``): one short is
    refused before anything runs, naming the input, the axis and the expression (onnxruntime,
    which knows no such relation, fails inside the model)."""
    from models.decoder_cache import step_inputs
    from tscomp.errors import ExecutionError
    session, rt, geometry = decoder
    feed = step_inputs(geometry, 3, 5, np.random.default_rng(0))
    feed["attention_mask"] = feed["attention_mask"][:, 1:]
    with pytest.raises(Exception):
        session.run(None, feed)
    with pytest.raises(ExecutionError, match="input 'attention_mask' axis 1 is 7, expected past \\+ sequence = 8"):
        rt.run(feed)
