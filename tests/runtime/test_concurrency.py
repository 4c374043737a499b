"""run() from several threads on one Runtime (issue 10): calls at random shapes run concurrently,
each in its own arena, and give exactly what sequential calls give."""
from __future__ import annotations

import threading

import numpy as np

from tscomp.runtime import Runtime


def _requests(n: int, seed: int):
    from models.families import make_inputs
    rng = np.random.default_rng(seed)
    # few distinct lengths: several threads meet at one shape and must not share its arena
    lengths = rng.choice([1, 2, 7, 13, 31, 64, 97], size=n)
    batches = rng.integers(1, 4, size=n)
    return [make_inputs("bert", {"batch": int(b), "sequence": int(L)}, rng, size="tiny")
            for b, L in zip(batches, lengths)]


def test_eight_threads_at_random_shapes_match_sequential_runs(compiled_artifact):
    path, _, _ = compiled_artifact("bert")
    rt = Runtime(path, num_threads=1)
    requests = _requests(48, seed=5)
    want = [rt.run(x)["last_hidden_state"] for x in requests]
    got: list = [None] * len(requests)
    errors: list = []
    barrier = threading.Barrier(8)

    def worker(k: int) -> None:
        try:
            barrier.wait()
            for i in range(k, len(requests), 8):
                for _ in range(2):
                    got[i] = rt.run(requests[i])["last_hidden_state"]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i, (a, b) in enumerate(zip(want, got)):
        np.testing.assert_array_equal(a, b, err_msg=f"request {i}")


def test_calls_at_one_shape_use_separate_arenas(compiled_artifact):
    """While one call holds a shape's pooled arena, another call at that shape gets a new one."""
    path, _, _ = compiled_artifact("bert")
    rt = Runtime(path, num_threads=1, warmup=False, executor="python")
    x = _requests(1, seed=1)[0]
    rt.run(x)
    binding, _ = rt._bind(x)
    shape = rt._shape_plan(binding)
    held = shape.free_arenas.pop()           # as if a concurrent call were using it
    out = rt.run(x)["last_hidden_state"]
    assert len(shape.free_arenas) == 1 and shape.free_arenas[0][0] is not held[0]
    shape.free_arenas.append(held)
    np.testing.assert_array_equal(out, rt.run(x)["last_hidden_state"])


def test_evicted_shapes_hand_their_arena_to_new_shapes(compiled_artifact):
    """A new shape reuses the buffer of a shape the cache dropped (memory already touched), and the
    results stay right."""
    from models.families import make_inputs
    from tscomp.runtime import runtime as runtime_module

    path, _, _ = compiled_artifact("bert")
    rt = Runtime(path, num_threads=1, warmup=False, executor="python")
    n = runtime_module.SHAPE_CACHE_SIZE + 8
    rng = np.random.default_rng(9)
    requests = [make_inputs("bert", {"batch": 1, "sequence": L}, rng, size="tiny") for L in range(n + 40, 40, -1)]
    raws, first = set(), []
    for x in requests:                      # every shape new, each smaller than the last
        first.append(rt.run(x)["last_hidden_state"])
        binding, _ = rt._bind(x)
        raws.add(id(rt._shape_plan(binding).free_arenas[0][0]))
    assert len(raws) <= runtime_module.SHAPE_CACHE_SIZE + 1 < len(requests)   # later shapes reused buffers
    again = [rt.run(x)["last_hidden_state"] for x in requests]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
