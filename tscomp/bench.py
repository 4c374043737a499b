"""``tscomp bench``: tscomp and onnxruntime side by side, in one process, at the same random shapes
with the same inputs and the same thread count; a table of latencies and ratios, and a plot.

Per shape: onnxruntime is warmed up, then, after the pause and two tscomp calls at the previous
shape, tscomp runs its *first call* at that never-seen shape (timed on its own: no compilation may
hide there), then both are timed alternately in blocks and the best block median of each is kept.
Last, the *seen call*: the first call's pattern again (the pause, two calls at the previous shape,
one call at this shape, now served before). ``first/seen`` is what the shape's novelty costs; the
switch itself costs both calls alike: the caches the previous shape left, and -- where the previous
shape is short enough that its calls open no parallel region -- the OpenMP pool's wake-up after the
pause (~60 us on these VMs), which a single call at a short length cannot hide.

Between blocks the process idles for ``settle_s``: both
systems' worker threads spin for milliseconds after their last parallel region (onnxruntime's pool
and OpenMP alike), and on a machine with as many cores as threads a spinning neighbour halves the
other's speed — measured here, 2 cores: BERT-base at L=9 costs 39 ms right after an onnxruntime
call and 19 ms after a 50 ms pause, and onnxruntime likewise 29 ms vs 19 ms after tscomp. Outputs are compared at each shape (max abs error is reported), so a
fast wrong answer cannot pass as a win. Where this CPU's onnxruntime sums uint8 x int8 products
through a saturating int16 (no VNNI), the answers are those of onnxruntime on the model with its
uint8 x int8 GEMMs made exact (:mod:`tscomp.exact_integer_reference`); the model as given is timed.
"""
from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tscomp.errors import TscompError
from tscomp.graph.symbols import DEFAULT_MAX
from tscomp.runtime import Runtime
from tscomp.sample_inputs import random_inputs


@dataclass
class ShapeResult:
    binding: dict[str, int]
    ort_s: float
    tscomp_s: float
    first_call_s: float
    max_abs_err: float
    seen_call_s: float

    @property
    def ratio(self) -> float:
        return self.tscomp_s / self.ort_s


@dataclass
class BenchResult:
    model: str
    threads: int
    exact_reference: bool = False    # errors against onnxruntime on the exact-integer rewrite
    results: list[ShapeResult] = field(default_factory=list)

    def geomean(self) -> float:
        return math.exp(sum(math.log(r.ratio) for r in self.results) / len(self.results))

    def worst(self) -> ShapeResult:
        return max(self.results, key=lambda r: r.ratio)


def sample_bindings(runtime: Runtime, samples: int, seed: int, fixed: dict[str, int],
                    within: dict[str, tuple[int, ...]] | None = None) -> list[dict[str, int]]:
    """``samples`` random shapes (uniform per symbol over its range, or over the sub-range
    ``within`` gives it as ``(lo, hi)`` or ``(lo, hi, step)``: ViT's image sides in multiples of 16;
    fixed symbols held), sorted."""
    rng = np.random.default_rng(seed)
    infos = [i for i in runtime.graph.symbols.live_symbols()]
    within = within or {}
    for name, (lo, hi, *_) in within.items():
        info = next((i for i in infos if i.name == name), None)
        if info is None or not info.min <= lo <= hi <= info.max:
            declared = f"{info.min}:{info.max}" if info else "not a symbol of this model"
            raise TscompError(f"--within {name}={lo}:{hi} is not inside the declared range ({declared})")
    for i in infos:
        if i.name not in fixed and i.name not in within and i.max >= DEFAULT_MAX:
            raise TscompError(f"dimension {i.name!r} has no upper bound ({i.min}:{i.max}, the default where no --dim "
                              f"bounds it), so random shapes cannot be drawn from it: hold it with --fix {i.name}=N, "
                              f"sample it with --within {i.name}=LO:HI, or compile with --dim {i.name}=MIN:MAX")
    out = []
    for _ in range(samples):
        binding = {}
        for i in infos:
            lo, hi, step = (*within.get(i.name, (i.min, i.max)), 1)[:3]
            binding[i.name] = int(fixed[i.name]) if i.name in fixed else \
                int(lo + step * rng.integers(0, (hi - lo) // step + 1))
        out.append(binding)
    return sorted(out, key=lambda b: tuple(b[i.name] for i in infos))


def ort_session(model_path: str | bytes, threads: int):
    """onnxruntime on ``model_path`` (or a serialized model) with ``threads`` intra-op threads."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    try:
        return ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
        what = model_path if isinstance(model_path, str) else "the model"
        raise TscompError(f"onnxruntime cannot load {what}: {str(exc).splitlines()[0][:300]}") from None


def exact_reference_session(model_path: str, threads: int):
    """An onnxruntime session whose integer GEMMs give the ONNX semantics' exact sums on this CPU,
    where the timed session's do not (None: the timed session is the reference)."""
    import onnx

    from tscomp.exact_integer_reference import reference_model, u8s8_saturates

    if not u8s8_saturates():
        return None
    exact = reference_model(onnx.load(model_path))
    return None if exact is None else ort_session(exact.SerializeToString(), threads)


def _timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _call_after_switch(runtime: Runtime, sess, previous: dict, inputs: dict, settle_s: float, reference=None):
    """The first and the seen call's pattern: onnxruntime's call at ``inputs``, the pause, two tscomp
    calls at the previous shape (a serving process), then one timed tscomp call with ``inputs``:
    (its seconds, its outputs, onnxruntime's outputs -- ``reference``'s where given)."""
    want = sess.run(None, inputs)
    if reference is not None:
        want = reference.run(None, inputs)
    time.sleep(settle_s)
    for _ in range(2):
        runtime.run(previous)
    t = time.perf_counter()
    got = runtime.run(inputs)
    return time.perf_counter() - t, got, want


def bench(runtime: Runtime, model_path: str, bindings: list[dict[str, int]], *, threads: int,
          seed: int = 0, budget_s: float = 0.5, settle_s: float = 0.1, progress=None) -> BenchResult:
    sess = ort_session(model_path, threads)
    reference = exact_reference_session(model_path, threads)
    names = [o.name for o in sess.get_outputs()]
    result = BenchResult(model_path, threads, exact_reference=reference is not None)
    rng = np.random.default_rng(seed + 1)
    previous = random_inputs(runtime.graph, {i.name: i.min for i in runtime.graph.symbols.live_symbols()}, rng)
    for n, binding in enumerate(bindings):
        inputs = random_inputs(runtime.graph, binding, rng)
        ort_inputs = {k: v for k, v in inputs.items()}
        first, got, want = _call_after_switch(runtime, sess, previous, ort_inputs, settle_s,
                                              reference)  # tscomp's first call here
        err = max(float(np.max(np.abs(got[k].astype(np.float64) - w))) if w.size else 0.0
                  for k, w in zip(names, want))
        one = max(first, _timed(lambda: sess.run(None, ort_inputs), 1))
        repeats = max(5, min(50, int(budget_s / max(one, 1e-6) / 2)))
        ort_t, ts_t = [], []
        for _ in range(3):                                      # alternate blocks: fair to both under noise
            time.sleep(settle_s)
            ort_t.append(_timed(lambda: sess.run(None, ort_inputs), repeats))
            time.sleep(settle_s)
            ts_t.append(_timed(lambda: runtime.run(inputs), repeats))
        seen, _, _ = _call_after_switch(runtime, sess, previous, ort_inputs, settle_s)  # the same, now served
        previous = inputs
        r = ShapeResult(dict(binding), min(ort_t), min(ts_t), first, err, seen)
        result.results.append(r)
        if progress:
            progress(n + 1, len(bindings), r)
    return result


def table(result: BenchResult) -> list[str]:
    syms = list(result.results[0].binding) if result.results else []
    head = "  ".join(f"{s:>9}" for s in syms)
    lines = [f"{head}  {'onnxruntime ms':>14}  {'tscomp ms':>10}  {'ratio':>6}  {'first-call ms':>13}  "
             f"{'first/steady':>12}  {'first/seen':>10}  {'max abs err':>11}"]
    for r in result.results:
        vals = "  ".join(f"{r.binding[s]:>9}" for s in syms)
        lines.append(f"{vals}  {r.ort_s * 1e3:14.3f}  {r.tscomp_s * 1e3:10.3f}  {r.ratio:6.3f}  "
                     f"{r.first_call_s * 1e3:13.3f}  {r.first_call_s / r.tscomp_s:12.2f}  "
                     f"{r.first_call_s / r.seen_call_s:10.2f}  {r.max_abs_err:11.2e}")
    w = result.worst()
    lines.append(f"tscomp/onnxruntime latency ratio over {len(result.results)} shapes ({result.threads} threads): "
                 f"geomean {result.geomean():.3f}, worst {w.ratio:.3f} at {w.binding}")
    if result.exact_reference:
        lines.append("max abs err: against onnxruntime on the model with its uint8 x int8 GEMMs as uint8 x uint8 "
                     "(this CPU's onnxruntime saturates uint8 x int8 sums in int16: no VNNI)")
    return lines


def plot(result: BenchResult, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rs = result.results
    varying = [s for s in rs[0].binding if len({r.binding[s] for r in rs}) > 1]
    if len(varying) == 1:
        xs, xlabel = [r.binding[varying[0]] for r in rs], varying[0]
    else:
        xs, xlabel = [math.prod(r.binding.values()) for r in rs], " × ".join(rs[0].binding)
    order = np.argsort(xs)
    x = np.asarray(xs)[order]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 7), sharex=True, gridspec_kw={"height_ratios": [3, 1.3]})
    ax.plot(x, np.asarray([r.ort_s * 1e3 for r in rs])[order], "o-", label="onnxruntime")
    ax.plot(x, np.asarray([r.tscomp_s * 1e3 for r in rs])[order], "s-", label="tscomp")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{Path(result.model).name}: latency vs {xlabel} ({result.threads} threads)")
    ax.legend()
    ax.grid(alpha=0.3)
    ax2.plot(x, np.asarray([r.ratio for r in rs])[order], "d-", color="tab:red")
    ax2.axhline(1.0, color="gray", lw=1)
    ax2.set_ylabel("tscomp / ort")
    ax2.set_xlabel(xlabel)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["BenchResult", "ShapeResult", "bench", "plot", "sample_bindings", "table"]
