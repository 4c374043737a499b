"""Greedy generation with a KV cache: tscomp and onnxruntime serve the same token-by-token loop.

    .venv/bin/python -m benchmarks.generate [--models llama,gpt2] [--exporters torchscript,dynamo] [--size tiny|small]
        [--prompt 17] [--new 96] [--rounds 3] [--plot .cache/bench/generate.png]

A decoder with an explicit cache (:mod:`models.decoder_cache`) is called once for the prompt (past
= 0) and once per new token (sequence = 1, past = prompt, prompt + 1, ...): every step is a shape
neither system saw before, which is the case tscomp compiles for. Per model and exporter:

1. export, and compile for one request (``batch`` = 1) with ``sequence`` in 1..prompt, ``past`` in
   0..prompt+new (empty cache included) and the mask's length ``total`` = past + sequence (a
   derived dim);
2. check logits and presents against onnxruntime (rtol = atol = 1e-4) at steps with random caches:
   past 0, 1, primes and the range end, one- and multi-token steps;
3. generate: onnxruntime runs the greedy loop (each step's argmax is the next token, its presents
   the next past); tscomp serves the very same tokens with its *own* presents fed back, so both
   see identical shapes and tscomp's cache drifts only by its own rounding; every step's logits
   are compared and the argmax agreement is counted;
4. time the loop: both systems alternate whole loops ``--rounds`` times in this process (2 threads
   each), each loop after three untimed calls at another shape (a server in operation: after an
   idle pause both systems' first call pays for waking their workers); per step the median over
   the rounds. Prints the prompt step, the decode steps' total
   and the ratio, and plots the per-step latency against the cache length.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import pathlib
import subprocess
import sys
import time
import warnings

import numpy as np

from models.decoder_cache import (FAMILIES, CacheGeometry, export_decoder, next_step_inputs, output_names,
                                  step_inputs)

RTOL = ATOL = 1e-4


def compile_decoder(path: pathlib.Path, art: pathlib.Path, prompt: int, longest: int, budget: str,
                    records: pathlib.Path) -> None:
    cmd = [sys.executable, "-m", "tscomp.cli", "compile", str(path), "-o", str(art), "--budget", budget,
           "--records", str(records), "--dim", "batch=1", "--dim", f"sequence=1:{prompt}", "--dim", f"past=0:{longest}",
           "--dim", "total=past+sequence"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"tscomp compile failed:\n{(p.stderr or p.stdout)[-1500:]}")


def check_steps(rt, session, geometry: CacheGeometry, prompt: int, longest: int) -> list[str]:
    """Random-cache steps at past 0, 1, primes and the range end: the mismatches, named."""
    steps = [(prompt, 0), (1, 0), (1, 1), (2, 1), (1, 2), (3, 7), (1, 13), (prompt, 31), (1, longest)]
    rng = np.random.default_rng(3)
    fails = []
    for sequence, past in steps:
        feed = step_inputs(geometry, sequence, past, rng)
        want = session.run(None, feed)
        got = rt.run(feed)
        for name, w in zip(output_names(geometry.layers), want):
            g = got[name]
            if g.shape != w.shape or not np.allclose(g, w, RTOL, ATOL):
                fails.append(f"sequence={sequence} past={past} {name}: "
                             + (f"shape {g.shape} vs {w.shape}" if g.shape != w.shape
                                else f"max abs diff {float(np.abs(g - w).max()):.2e}"))
    return fails


def reference_loop(session, geometry: CacheGeometry, prompt_ids: np.ndarray, new: int):
    """onnxruntime's greedy loop: the token fed at each step and the logits it produced."""
    feed = step_inputs(geometry, prompt_ids.shape[1], 0, np.random.default_rng(0))
    feed["input_ids"] = prompt_ids
    tokens, logits = [prompt_ids], []
    for _ in range(new + 1):
        out = session.run(None, feed)
        logits.append(out[0][:, -1])
        nxt = out[0][:, -1].argmax(-1).reshape(1, 1).astype(np.int64)
        feed = next_step_inputs(feed, out[1:], nxt)
        tokens.append(nxt)
    return tokens[:-1], logits


def serve_loop(call, geometry: CacheGeometry, tokens) -> tuple[list[float], list[np.ndarray]]:
    """Serve the given tokens step by step, feeding back the system's own presents: per-step
    seconds and last-position logits."""
    feed = step_inputs(geometry, tokens[0].shape[1], 0, np.random.default_rng(0))
    feed["input_ids"] = tokens[0]
    times, logits = [], []
    for i in range(len(tokens)):
        t = time.perf_counter()
        out = call(feed)
        times.append(time.perf_counter() - t)
        logits.append(out[0][:, -1])
        if i + 1 < len(tokens):
            feed = next_step_inputs(feed, out[1:], tokens[i + 1])
    return times, logits


def run_model(name: str, exporter: str, args) -> dict:
    import onnxruntime as ort

    from tscomp.runtime import Runtime

    cache = pathlib.Path(args.cache)
    row = {"model": name, "exporter": exporter}
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            path = export_decoder(name, exporter, cache, args.size)
    except Exception as e:     # noqa: BLE001 - the exporter's failure is this row's result
        return row | {"error": f"export: {type(e).__name__}: {str(e)[:300]}"}
    longest = args.prompt + args.new
    art = cache / f"{path.stem}.tsc"
    t = time.time()
    try:
        compile_decoder(path, art, args.prompt, longest, args.budget, cache / "tuning-records.json")
    except RuntimeError as e:
        return row | {"error": str(e)}
    row["compile_s"] = time.time() - t
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    rt = Runtime(str(art), num_threads=2)
    geometry = CacheGeometry.of_inputs(session.get_inputs())
    row["fails"] = check_steps(rt, session, geometry, args.prompt, longest)

    prompt_ids = np.random.default_rng(1).integers(3, 1000, (1, args.prompt)).astype(np.int64)
    tokens, want = reference_loop(session, geometry, prompt_ids, args.new)
    outs = output_names(geometry.layers)
    tscomp_call = lambda feed: [r[n] for r in (rt.run(feed),) for n in outs]     # noqa: E731
    ort_call = lambda feed: session.run(None, feed)                               # noqa: E731
    _, got = serve_loop(tscomp_call, geometry, tokens)
    diffs = [float(np.abs(g - w).max()) for g, w in zip(got, want)]
    row["agree"] = sum(int(g.argmax() == w.argmax()) for g, w in zip(got, want))
    row["steps"] = len(want)
    row["max_logit_diff"] = max(diffs)
    if not all(np.allclose(g, w, RTOL, ATOL) for g, w in zip(got, want)):
        row["fails"].append(f"generation: logits differ by up to {max(diffs):.2e}")

    per = {"tscomp": [], "onnxruntime": []}
    busy = step_inputs(geometry, 2, 3, np.random.default_rng(2))
    for _ in range(args.rounds):
        for system, call in (("tscomp", tscomp_call), ("onnxruntime", ort_call)):
            time.sleep(0.1)     # the other system's workers stop spinning
            for _ in range(3):  # a server in operation: the prompt meets awake workers, not sleeping ones
                call(busy)
            per[system].append(serve_loop(call, geometry, tokens)[0])
    med = {s: np.median(np.array(v), axis=0) for s, v in per.items()}
    row["prompt_ms"] = {s: float(m[0] * 1e3) for s, m in med.items()}
    row["decode_ms"] = {s: float(m[1:].sum() * 1e3) for s, m in med.items()}
    row["step_ms"] = {s: [float(x * 1e3) for x in m] for s, m in med.items()}
    return row


def plot(rows: list[dict], prompt: int, png: pathlib.Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "step_ms" in r]
    if not done:
        return
    fig, axes = plt.subplots(1, len(done), figsize=(4.5 * len(done), 3.4), squeeze=False)
    for ax, r in zip(axes[0], done):
        for system, style in (("tscomp", "-"), ("onnxruntime", "--")):
            steps = r["step_ms"][system][1:]
            ax.plot(range(prompt, prompt + len(steps)), [s * 1e3 for s in steps], style, label=system)
        ax.set_title(f"{r['model']} ({r['exporter']})")
        ax.set_xlabel("cached tokens (past)")
        ax.set_ylabel("decode step (us)")
        ax.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    print(f"plot: {png}")


def row_text(r: dict) -> str:
    head = f"{r['model']:>8} {r['exporter']:>11}  "
    if "error" in r:
        return head + "FAILED " + r["error"].strip().splitlines()[-1][:160]
    ok = "ok" if not r["fails"] else f"MISMATCH ({len(r['fails'])}: {r['fails'][0]})"
    p, d = r["prompt_ms"], r["decode_ms"]
    return (head + f"{ok:>8}  argmax {r['agree']}/{r['steps']}  prompt {p['tscomp']:.3f} / {p['onnxruntime']:.3f} ms "
            f"= {p['tscomp'] / p['onnxruntime']:.2f}  decode {d['tscomp']:.1f} / {d['onnxruntime']:.1f} ms "
            f"= {d['tscomp'] / d['onnxruntime']:.2f}  (compile {r['compile_s']:.0f} s)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="llama,gpt2", help=f"of {', '.join(FAMILIES)}")
    ap.add_argument("--exporters", default="torchscript")
    ap.add_argument("--size", default="tiny", help="models.decoder_cache.SIZES: tiny or small")
    ap.add_argument("--prompt", type=int, default=17)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", default="4,60s", help="tscomp compile --budget")
    ap.add_argument("--cache", default=".cache/generate", help="exports, artifacts and tuning records")
    ap.add_argument("--plot", default=".cache/bench/generate.png")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print("model      exporter   check   argmax agreement  prompt tscomp / onnxruntime  "
          "decode (all new tokens) tscomp / onnxruntime")
    rows = []
    for name in args.models.split(","):
        for exporter in args.exporters.split(","):
            rows.append(run_model(name, exporter, args))
            print(row_text(rows[-1]), flush=True)
    done = [r for r in rows if "decode_ms" in r]
    if done:
        ratios = [r["decode_ms"]["tscomp"] / r["decode_ms"]["onnxruntime"] for r in done]
        print(f"decode tscomp/onnxruntime geomean {float(np.exp(np.mean(np.log(ratios)))):.3f} over {len(done)}")
    plot(rows, args.prompt, pathlib.Path(args.plot))


if __name__ == "__main__":
    main()
