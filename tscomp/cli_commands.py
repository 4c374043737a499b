"""``tscomp compile``, ``tscomp run`` and ``tscomp bench``: argument handling and reports around
:mod:`tscomp.compiler`, :mod:`tscomp.runtime` and :mod:`tscomp.bench`."""
from __future__ import annotations

import json

import re
import sys
import time
from collections import Counter
from pathlib import Path

from tscomp.codegen.families import DEFAULT_VARIANTS
from tscomp.errors import TscompError
from tscomp.graph.half_precision import has_float16
from tscomp.runtime.artifact import INTEGER_GEMMS, INTEGER_GEMMS_ON, file_sha256


class Progress:
    """One status line on stderr, redrawn in place on a terminal, every ~10% otherwise."""

    def __init__(self, what: str, stream=None):
        self.what, self.stream = what, stream or sys.stderr
        self.tty = self.stream.isatty()
        self.t0 = time.perf_counter()
        self.last_decile = -1

    def __call__(self, done: int, total: int, item: str) -> None:
        elapsed = time.perf_counter() - self.t0
        line = f"{self.what} [{done:>{len(str(total))}}/{total}] {elapsed:6.1f}s  {item}"
        if self.tty:
            self.stream.write("\r\033[K" + line[:150] + ("\n" if done == total else ""))
        else:
            decile = (10 * done) // max(1, total)
            if decile == self.last_decile and done != total:
                return
            self.last_decile = decile
            self.stream.write(line + "\n")
        self.stream.flush()


def parse_shapes(items: list[str]) -> dict[str, int]:
    out = {}
    for item in items:
        m = re.fullmatch(r"\s*([A-Za-z_][\w.]*)\s*=\s*(\d+)\s*", item)
        if not m:
            raise TscompError(f"--shape {item!r}: expected NAME=VALUE, e.g. --shape sequence=37")
        out[m[1]] = int(m[2])
    return out


def parse_budget(text: str | None):
    """``--budget``: ``N`` trials per distinct tunable group on average, ``Ns``/``Nm`` seconds for the whole
    compile, or both as ``N,Ss``. Returns (trials, seconds) with defaults filled in."""
    from tscomp.schedule.schedules import DEFAULT_SECONDS, DEFAULT_TRIALS

    if text is None:
        return DEFAULT_TRIALS, DEFAULT_SECONDS
    trials, seconds = None, None
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min)?\s*", part)
        if not m:
            raise TscompError(f"--budget {text!r}: expected N (trials per group), Ns or Nm (time), or N,Ss")
        if m[2]:
            seconds = float(m[1]) * (60 if m[2] in ("m", "min") else 1)
        else:
            trials = int(float(m[1]))
    return trials, seconds


def tuning_options(args, quiet: bool = False):
    """TuningOptions from the compile/bench flags (None: heuristic configurations, no tuning)."""
    from tscomp.schedule.records import RecordStore
    from tscomp.schedule.schedules import TuningOptions

    if getattr(args, "no_tune", False):
        return None
    trials, seconds = parse_budget(getattr(args, "budget", None))
    records = RecordStore.load(args.records) if getattr(args, "records", None) else None
    return TuningOptions(tune=True, trials=trials, seconds=seconds, records=records, progress=not quiet)


def compile_to(model: str, dims: list[str], output: str, *, variants: int, threads: int | None,
               quiet: bool = False, tuning=None, embed_source: bool = False, precision: str = "fp32"):
    """Compile ``model`` (its GEMMs at ``precision``) and write the artifact; returns (artifact path,
    CompiledModel)."""
    from tscomp.compiler import compile_model
    from tscomp.runtime.artifact import write_artifact

    if not Path(model).is_file():
        raise TscompError(f"{model}: no such model file")
    from tscomp.schedule.target import check_precision, host_cpu
    check_precision(precision, host_cpu().spec)     # a CPU without avx512_bf16: refused before any work
    log = None if quiet else (lambda line: print(f"tuned {line}", file=sys.stderr))
    compiled = compile_model(model, dims, max_variants=variants, threads=threads, tuning=tuning, log=log,
                             progress=None if quiet else Progress("compiling groups"), precision=precision)
    if tuning is not None and tuning.records is not None and tuning.records.path is not None:
        tuning.records.save()
    compiled.notes.append(f"source sha256 {file_sha256(Path(model))}")
    path = write_artifact(compiled, output, progress=None if quiet else Progress("linking kernels"),
                          embed_source=embed_source)
    return path, compiled


def _integer_gemms(compiled) -> list[str]:
    """A line naming the GEMM and Conv groups of integer operands (a quantized model's) that run at
    another precision than the model's (tscomp.codegen.families.gemm_target, conv_target), if any: per
    group, the precision of its variants that have one (a Conv's Winograd variant stays fp32)."""
    other = Counter()
    for ks in compiled.kernels.values():
        special = {(k.precision, getattr(k, "isa", "")) for k in ks
                   if getattr(k, "precision", compiled.target.precision) != compiled.target.precision}
        for p, isa in special:
            other[(ks[0].family, p, INTEGER_GEMMS_ON.get((p, isa), INTEGER_GEMMS[p]))] += 1
    return ["quantized GEMMs and Convs: " + "; ".join(f"{n} {family} group(s) {text}"
                                                      for (family, p, text), n in sorted(other.items()))] if other else []


def _summary(compiled, path: Path) -> list[str]:
    fams = Counter(ks[0].family for ks in compiled.kernels.values())
    n_var = sum(len(ks) for ks in compiled.kernels.values())
    size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    lines = [f"wrote {path} ({size / 1e6:.1f} MB): {len(compiled.plan.groups)} groups, {n_var} kernel variants, "
             f"{compiled.compile_seconds:.1f}s; kernels by family: "
             + ", ".join(f"{k} {v}" for k, v in sorted(fams.items())),
             f"precision: {compiled.target.precision}"
             + (" (constant-weight GEMMs in bf16 with fp32 accumulation; attention GEMMs, Conv and every other "
                "op in fp32)" if compiled.target.precision == "bf16" else ""),
             *(["float16 model: every operator computed in float32, float16 at its inputs and outputs "
                "(tscomp/graph/half_precision.py)"] if has_float16(compiled.plan.graph) else []),
             *_integer_gemms(compiled),
             f"schedules ({compiled.target.describe()}): {compiled.config_source}"
             + (f", {compiled.schedules.seconds:.0f}s" if compiled.schedules is not None else "")]
    lines += [n for n in compiled.notes if n.startswith("packed weights:")]
    host = json.loads((path / "manifest.json").read_text()).get("host")
    lines.append(f"host program: {host['native_steps']} of {host['steps']} groups called natively, one native call "
                 f"per request (kernels.so: tscomp_host_run)" if host else
                 "host program: not generated; the runtime calls the groups one by one from Python")
    fallback = compiled.fallback_groups()
    if fallback:
        lines.append(f"{len(fallback)} group(s) run on the numpy fallback (no macro-kernel family accepts them):")
        for g in fallback:
            why = compiled.kernels[g][0].reasons    # every family that looked at it, and why it declined
            lines.append(f"  {g}: " + (" | ".join(why) if why else "?"))
    return lines


def cmd_compile(args) -> int:
    if getattr(args, "measure_gpu", False) and getattr(args, "target", "cpu") != "cuda":
        raise TscompError("--measure-gpu times CUDA kernels: it needs --target cuda (the CPU target always measures; "
                          "--budget sets how long)")
    if getattr(args, "target", "cpu") == "cuda":
        if args.precision != "fp32":
            raise TscompError(f"--precision {args.precision} is implemented for --target cpu only")
        from tscomp.codegen.simt.compile import compile_cuda_command
        print("\n".join(compile_cuda_command(args.model, args.dim, args.output, args.arch or None,
                                             measure=args.measure_gpu, measure_top=args.measure_top)))
        return 0
    path, compiled = compile_to(args.model, args.dim, args.output, variants=args.variants, threads=args.threads,
                                tuning=tuning_options(args), embed_source=args.embed_source,
                                precision=args.precision)
    print("\n".join(_summary(compiled, path)))
    print(f"artifact digest {json.loads((path / 'manifest.json').read_text())['digest']} "
          f"(Runtime(path, expected_digest=...) accepts only this artifact)")
    return 0


def cmd_run(args) -> int:
    import numpy as np

    from tscomp.runtime import Runtime
    from tscomp.sample_inputs import random_inputs, shape_binding

    if args.device == "cpu":
        rt = Runtime(args.artifact, num_threads=args.threads, allow_out_of_range=args.allow_out_of_range,
                     executor=args.executor)
    else:
        rt = Runtime(args.artifact, device=args.device)
    binding = shape_binding(rt.graph, parse_shapes(args.shape))
    inputs = random_inputs(rt.graph, binding, np.random.default_rng(args.seed))
    t = time.perf_counter()
    outputs = rt.run(inputs)
    first = time.perf_counter() - t
    times, overheads = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        rt.run(inputs)
        times.append(time.perf_counter() - t)
        if getattr(rt, "last_call_overhead", None) is not None:
            overheads.append(rt.last_call_overhead)
    print("shape: " + ", ".join(f"{k}={v}" for k, v in binding.items()))
    for name, arr in inputs.items():
        print(f"  input  {name}: {arr.dtype}{list(arr.shape)}")
    for name, arr in outputs.items():
        print(f"  output {name}: {arr.dtype}{list(arr.shape)}  mean {float(np.mean(arr)):.6g}")
    steady = sorted(times)[len(times) // 2] if times else first
    where = (f"{rt.num_threads} threads, {rt.executor} executor, request path: {rt.request_path_note}"
             if args.device == "cpu" else f"device {args.device}")
    overhead = sorted(overheads)[len(overheads) // 2] if overheads else None
    print(f"latency: first call {first * 1e3:.3f} ms, steady {steady * 1e3:.3f} ms (median of {len(times)}), {where}"
          + (f"; runtime overhead per call {overhead * 1e6:.0f} us (median)" if overhead is not None else ""))
    if args.device == "cpu":
        print(rt.solo_policy.describe())    # how a request that follows an idle pause runs
    return 0


def _artifact_for_bench(args) -> Path:
    """The artifact to benchmark: the given one, or the model compiled (reused when the artifact at
    the output path was compiled from the same model bytes with the same --dim)."""
    from tscomp.runtime.artifact import ArtifactError, read_manifest

    src = Path(args.model)
    if src.is_dir():
        return src
    out = Path(args.artifact or src.with_suffix(".tsc"))
    try:
        mf = read_manifest(out)
        if mf.get("dims") == list(args.dim) and f"source sha256 {file_sha256(src)}" in mf.get("notes", []) \
                and mf.get("precision", "fp32") == args.precision:
            print(f"using the compiled artifact {out}", file=sys.stderr)
            return out
    except ArtifactError:
        pass
    path, compiled = compile_to(str(src), args.dim, str(out), variants=args.variants, threads=args.threads,
                                tuning=tuning_options(args), precision=args.precision)
    print("\n".join(_summary(compiled, path)), file=sys.stderr)
    return path


def parse_ranges(specs) -> dict[str, tuple[int, int]]:
    """``NAME=LO:HI`` flags -> {name: (lo, hi)}."""
    out = {}
    for spec in specs:
        name, _, rng = spec.partition("=")
        lo, sep, hi = rng.partition(":")
        try:
            lo_i, hi_i = int(lo), int(hi)
        except ValueError:
            raise TscompError(f"--within {spec!r}: expected NAME=LO:HI with integers") from None
        if not name or not sep or lo_i > hi_i:
            raise TscompError(f"--within {spec!r}: expected NAME=LO:HI with LO <= HI")
        out[name] = (lo_i, hi_i)
    return out


def cmd_bench(args) -> int:
    from tscomp.bench import bench, plot, sample_bindings, table
    from tscomp.compiler import default_threads
    from tscomp.runtime import Runtime

    if args.against != "onnxruntime":
        raise TscompError(f"--against {args.against}: only onnxruntime is supported")
    threads = args.threads or default_threads()
    artifact = _artifact_for_bench(args)
    rt = Runtime(artifact, num_threads=threads)
    # an artifact carries a copy of its ONNX model: onnxruntime runs that very file
    onnx_path = args.model if not Path(args.model).is_dir() else str(rt.source_model_file())
    if not onnx_path or not Path(onnx_path).is_file():
        raise TscompError(f"bench needs the ONNX model for onnxruntime; {onnx_path!r} is not a file")
    fixed = parse_shapes(args.fix)
    bindings = sample_bindings(rt, args.samples, args.seed, fixed, parse_ranges(args.within))

    def show(done, total, r):
        print(f"bench [{done}/{total}] {r.binding}: ort {r.ort_s * 1e3:.2f} ms, tscomp {r.tscomp_s * 1e3:.2f} ms",
              file=sys.stderr)

    result = bench(rt, onnx_path, bindings, threads=threads, seed=args.seed, progress=show)
    print("\n".join(table(result)))
    picture = Path(args.plot or Path(artifact).with_suffix(".bench.png"))
    plot(result, picture)
    print(f"plot: {picture}")
    return 0


def add_commands(sub, add_dim_flag) -> None:
    p = sub.add_parser("compile", help="compile an ONNX model into an artifact directory")
    p.add_argument("model")
    add_dim_flag(p)
    p.add_argument("-o", "--output", required=True, help="artifact directory to write (e.g. model.tsc)")
    p.add_argument("--variants", type=int, default=DEFAULT_VARIANTS,
                   help=f"tile-config variants per GEMM group (default {DEFAULT_VARIANTS})")
    p.add_argument("--threads", type=int, default=None, help="threads for measuring single-wave times")
    p.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (default) or cuda: SIMT kernels, nvcc cubins + PTX, run with device='opencl'|'cuda'")
    p.add_argument("--arch", action="append", default=[], metavar="sm_XY",
                   help="CUDA architectures to build (repeatable; default sm_80 and sm_90)")
    p.add_argument("--measure-gpu", action="store_true",
                   help="--target cuda: time the cost model's best GEMM configurations on this machine's GPU "
                        "and keep the measured choice (needs an NVIDIA GPU and the 'cuda' extra)")
    p.add_argument("--measure-top", type=int, default=None, metavar="N",
                   help="configurations timed per distinct GEMM group with --measure-gpu (default 8)")
    p.add_argument("--embed-source", action="store_true",
                   help="copy the ONNX model into the artifact (for out-of-range shapes; otherwise that path "
                        "reads the source model the manifest names)")
    _add_tuning_flags(p)
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("run", help="run a compiled artifact on random inputs of a given shape")
    p.add_argument("artifact")
    p.add_argument("--shape", action="append", default=[], metavar="NAME=VALUE",
                   help="value of a dynamic dimension (repeatable; unset ones take their minimum)")
    p.add_argument("--repeat", type=int, default=10, help="timed repetitions after the first call")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--allow-out-of-range", action="store_true",
                   help="run shapes outside the compiled ranges on the reference executor")
    p.add_argument("--device", choices=("cpu", "opencl", "cuda"), default="cpu",
                   help="cpu (default), or opencl / cuda for a --target cuda artifact")
    p.add_argument("--executor", choices=("native", "python"), default="native",
                   help="cpu: one host-program call per request (default) or one Python call per group")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("bench", help="benchmark against onnxruntime at random shapes")
    p.add_argument("model", help="model.onnx (compiled if needed) or an artifact directory")
    add_dim_flag(p)
    p.add_argument("--against", default="onnxruntime")
    p.add_argument("--samples", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fix", action="append", default=[], metavar="NAME=VALUE",
                   help="hold a dimension at a value (e.g. --fix batch=1)")
    p.add_argument("--within", action="append", default=[], metavar="NAME=LO:HI",
                   help="sample a dimension only within LO:HI, inside its declared range (e.g. --within sequence=9:39)")
    p.add_argument("--threads", type=int, default=None, help="threads for both systems (default: all cores)")
    p.add_argument("--artifact", help="where to write/reuse the compiled artifact (default: MODEL.tsc)")
    p.add_argument("--variants", type=int, default=DEFAULT_VARIANTS)
    p.add_argument("--plot", help="PNG path for the latency plot (default: ARTIFACT.bench.png)")
    _add_tuning_flags(p)
    p.set_defaults(func=cmd_bench)


def _add_tuning_flags(p) -> None:
    from tscomp.schedule.schedules import DEFAULT_SECONDS, DEFAULT_TRIALS
    from tscomp.schedule.target import PRECISIONS

    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="GEMM precision: fp32 (default) or bf16 (constant-weight GEMMs on AVX512_BF16 with fp32 "
                        "accumulation; every other op stays fp32; needs a CPU with avx512_bf16)")
    p.add_argument("--no-tune", action="store_true",
                   help="skip the tile search: the families' hardware-aligned heuristic configurations")
    p.add_argument("--budget", metavar="N|Ns|N,Ss",
                   help=f"tuning budget: trials per distinct tunable group on average and/or seconds for the whole compile "
                        f"(both split among the groups by their measured share of a request's time) "
                        f"(default {DEFAULT_TRIALS},{DEFAULT_SECONDS:.0f}s)")
    p.add_argument("--records", metavar="FILE.json",
                   help="tuning records to reuse and extend (a group tuned before on this target is not tuned again)")


__all__ = ["add_commands"]
