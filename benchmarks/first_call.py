"""First-call vs steady-state latency at never-seen shapes (issue 10, acceptance 1: within 1.1x at
every length, L = 1..9 included), tscomp alone; and the runtime's per-call overhead (call time
minus the time inside the host program: issue 10 wants <= 20 us on tiny BERT).

    .venv/bin/python -m benchmarks.first_call [--artifact .cache/bench/bert-base-dynamo.tsc]
    .venv/bin/python -m benchmarks.first_call --artifact .cache/bench/bert-tiny-dynamo.tsc [--executor python]

Every request's inputs are made before anything is timed, and the process then serves
:data:`SERVER_WARMUP_CALLS` calls at a reference shape (a server in operation, not one just
started). Per length, never seen before by this process: a few calls at a reference shape (so the
first call meets a busy server, not one whose OpenMP team went to sleep while Python made inputs),
then the first call at the new length, the
median of 7 more calls at it (*steady*), and, as a control, the first call at a length the process
has served before after the same reference calls (*seen*: what returning to a shape costs once the
reference shape's variants and data filled the caches). ``first/seen`` isolates what a new shape
costs beyond any shape switch: 1.0 when nothing is planned on the request path. But a first call
meets caches that last ran its code paths at the warm-up, ``SERVER_WARMUP_CALLS`` and more
reference calls before, and the *seen* call only 3: a third control, *gap-seen*, returns to the
length once more after as many reference calls as separate the first measured length from the
warm-up (``--gap``), and ``first/gap-seen`` compares the two at equal distance from the shape's
last use. Every call carries
its own random token ids (a server's steady state at one length still sees new requests: repeating
one request's tokens kept their embedding rows cached for the steady calls only, which made every
first call look ~2 us dearer on tiny BERT). The last column
is a control near each length: the first call at another never-seen length right after a third
never-seen length that runs the very same variants (so their code and weights are warm).

A shape is new only once per process, so each first call is one sample of a ~0.1 ms call on a
noisy machine: ``--processes N`` repeats the whole measurement in N fresh processes, one after
the other, and reports the per-length medians.

``--onnx MODEL`` runs the very same call pattern (reference calls, first call, steady calls) on
onnxruntime in the same process, after tscomp, and adds its first/steady column: what a shape
switch costs a peer on this machine (the caches and predictors a switch leaves cold), next to
tscomp's.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np

from tscomp.runtime import Runtime
from tscomp.sample_inputs import random_inputs

#: the length the server serves between measured lengths (``--reference``). What a switch to a short
#: length costs depends on it: tiny BERT at L = 1 on a Zen 3 read first/steady 1.07-1.08 after calls
#: at L = 2..16 and 1.17-1.19 after L = 32..128, with one thread as with two (what the longer calls'
#: activations leave in the caches, not the team)
REFERENCE_LENGTH = 64

#: calls at the reference shape a process serves before the first measured length: right after
#: load and the making of every request, the first length met caches full of Python's work, and
#: its first call read 1.28x its later return after the same reference calls (tiny BERT, L = 1,
#: always the first length); after 50 such calls, 1.03-1.11x like every other length
SERVER_WARMUP_CALLS = 50


def _timed(call, inputs) -> float:
    t = time.perf_counter()
    call(inputs)
    return time.perf_counter() - t


#: distinct requests made per length: the first call, 7 steady calls, the *seen* and *gap-seen* calls
REQUESTS_PER_LENGTH = 10


def _requests(graph, binding: dict, seed: int) -> list[dict]:
    """``REQUESTS_PER_LENGTH`` requests of one shape, each with its own random contents."""
    return [random_inputs(graph, binding, np.random.default_rng([seed, j])) for j in range(REQUESTS_PER_LENGTH)]


def _switch_pattern(call, requests, reference) -> tuple[float, list[float]]:
    """Reference calls, then the first call at the new shape (``requests[0]``) and 7 more, each
    a request of its own (steady): (first, steady)."""
    for _ in range(3):
        call(reference)
    first = _timed(call, requests[0])
    return first, [_timed(call, r) for r in requests[1:8]]


def _ort_call(onnx: str, threads: int):
    """``call(inputs)`` running the ONNX model on onnxruntime with ``threads`` intra-op threads."""
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    sess = ort.InferenceSession(onnx, so, providers=["CPUExecutionProvider"])
    names = [i.name for i in sess.get_inputs()]
    return lambda inputs: sess.run(None, {n: inputs[n] for n in names})


def measure(args) -> list[dict]:
    """One process's table: per length, first, seen and steady seconds and the overhead."""
    t = time.perf_counter()
    rt = Runtime(args.artifact, num_threads=args.threads, executor=args.executor)
    load = time.perf_counter() - t
    base = {i.name: i.min for i in rt.graph.symbols.live_symbols()}
    lengths = [int(x) for x in args.lengths.split(",")]
    requests = {L: _requests(rt.graph, base | {"sequence": L}, L) for L in lengths + [args.reference]}
    reference = requests[args.reference][0]
    rows = []
    for _ in range(SERVER_WARMUP_CALLS):
        rt.run(reference)
    for L in lengths:
        over = []
        def call(inputs):
            rt.run(inputs)
            over.append(rt.last_call_overhead)
        first, steady = _switch_pattern(call, requests[L], reference)
        for _ in range(3):
            rt.run(reference)
        seen = _timed(rt.run, requests[L][8])
        for _ in range(args.gap):
            rt.run(reference)
        gap_seen = _timed(rt.run, requests[L][9])
        rows.append({"L": L, "first": first, "seen": seen, "gap_seen": gap_seen, "steady": statistics.median(steady),
                     "overhead": statistics.median(over[-7:]), "load": load, "executor": rt.executor})
    used = set(lengths) | {args.reference}
    for row in rows:
        row["warm"] = _first_with_warm_variants(rt, base, row["L"], used, reference)
    if args.onnx:     # the peer, same pattern, after tscomp (its own first calls: the same lengths are new to it)
        peer = _ort_call(args.onnx, args.threads)
        for _ in range(SERVER_WARMUP_CALLS):
            peer(reference)
        for row in rows:
            first, steady = _switch_pattern(peer, requests[row["L"]], reference)
            row["ort_first_steady"] = first / statistics.median(steady)
    return rows


def _first_with_warm_variants(rt, base: dict, near: int, used: set, reference) -> float | None:
    """Control: first call at a never-seen length whose variants a *different* never-seen length
    just ran (the same variant for every group), over its steady time -- what a shape's novelty
    costs once its variants' code and weights are warm. None when no such pair is near ``near``."""
    hi = max(i.max for i in rt.graph.symbols.live_symbols() if i.name == "sequence")
    pool = [L for L in range(max(1, near - 8), min(hi, near + 24) + 1) if L not in used]
    picks = {L: tuple(id(k) for k in rt.selected_variants(base | {"sequence": L}).values()) for L in pool}
    pair = next(((a, b) for a in pool for b in pool if a != b and picks[a] == picks[b]), None)
    if pair is None:
        return None
    target, twin = pair
    used.update(pair)
    inputs = {L: _requests(rt.graph, base | {"sequence": L}, L) for L in pair}
    for _ in range(3):
        rt.run(reference)
    for twin_request in inputs[twin][:2]:
        rt.run(twin_request)
    first = _timed(rt.run, inputs[target][0])
    steady = statistics.median(_timed(rt.run, r) for r in inputs[target][1:8])
    return first / steady


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--artifact", default=".cache/bench/bert-base-dynamo.tsc")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--executor", default="native", choices=["native", "python"])
    ap.add_argument("--lengths", default="1,2,3,4,5,6,7,8,9,21,39,90,139,202,287,374,498")
    ap.add_argument("--reference", type=int, default=REFERENCE_LENGTH,
                    help="the length served between the measured ones (the server's other requests)")
    ap.add_argument("--gap", type=int, default=SERVER_WARMUP_CALLS + 3,
                    help="reference calls before the gap-seen control (default: as many as precede the first length)")
    ap.add_argument("--processes", type=int, default=1, help="repeat in this many fresh processes (medians)")
    ap.add_argument("--onnx", default="", help="the source ONNX model: onnxruntime's first/steady under the same pattern")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    runs = []
    for _ in range(args.processes):
        cmd = [sys.executable, "-m", "benchmarks.first_call", "--child", "--artifact", args.artifact,
               "--threads", str(args.threads), "--executor", args.executor, "--lengths", args.lengths,
               "--reference", str(args.reference), "--gap", str(args.gap),
               "--onnx", args.onnx]
        runs.append(json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1]))
    print(f"{args.artifact}: executor {runs[0][0]['executor']}, reference length {args.reference}, load + verify + warm-up "
          f"{statistics.median(r[0]['load'] for r in runs):.2f} s; medians over {len(runs)} process(es)")
    print(f"{'sequence':>8}  {'first ms':>9}  {'seen ms':>8}  {'steady ms':>9}  {'first/steady':>12}  "
          f"{'seen/steady':>11}  {'first/seen':>10}  {'gap-seen/steady':>15}  {'first/gap-seen':>14}  "
          f"{'overhead us':>11}  {'warm-first/steady':>17}"
          + (f"  {'ort first/steady':>16}" if args.onnx else ""))
    cols = {"fs": [], "ss": [], "fn": [], "ov": [], "gs": [], "fg": [], "ort": []}
    for k, L in enumerate(r["L"] for r in runs[0]):
        med = {key: statistics.median(run[k][key] for run in runs) for key in ("first", "seen", "steady", "overhead")}
        def ratio(num: str, den: str) -> float:     # per process, then the median over processes
            return statistics.median(run[k][num] / run[k][den] for run in runs)
        fs, ss, fn = ratio("first", "steady"), ratio("seen", "steady"), ratio("first", "seen")
        gs, fg = ratio("gap_seen", "steady"), ratio("first", "gap_seen")
        for key, v in zip(cols, (fs, ss, fn, med["overhead"], gs, fg)):
            cols[key].append(v)
        warm = [run[k]["warm"] for run in runs if run[k]["warm"] is not None]
        peer = ""
        if args.onnx:
            cols["ort"].append(statistics.median(run[k]["ort_first_steady"] for run in runs))
            peer = f"  {cols['ort'][-1]:16.2f}"
        print(f"{L:>8}  {med['first'] * 1e3:9.3f}  {med['seen'] * 1e3:8.3f}  {med['steady'] * 1e3:9.3f}  {fs:12.2f}  "
              f"{ss:11.2f}  {fn:10.2f}  {gs:15.2f}  {fg:14.2f}  {med['overhead'] * 1e6:11.1f}  "
              f"{statistics.median(warm) if warm else float('nan'):17.2f}{peer}")
    print(f"first/steady: max {max(cols['fs']):.2f}, median {statistics.median(cols['fs']):.2f} (target <= 1.10); "
          f"seen/steady: max {max(cols['ss']):.2f}; first/seen: max {max(cols['fn']):.2f}, "
          f"median {statistics.median(cols['fn']):.2f}; gap-seen/steady: max {max(cols['gs']):.2f}; first/gap-seen: "
          f"max {max(cols['fg']):.2f}, median {statistics.median(cols['fg']):.2f}; overhead per call: median "
          f"{statistics.median(cols['ov']) * 1e6:.1f} us")
    if args.onnx:
        print(f"onnxruntime under the same pattern, first/steady: max {max(cols['ort']):.2f}, "
              f"median {statistics.median(cols['ort']):.2f}")


if __name__ == "__main__":
    main()
