"""Common torch operations, each in a one-line module exported at dynamic shapes, compiled by tscomp
and checked against onnxruntime: which operators an unseen model can bring that tscomp refuses.

    .venv/bin/python -m benchmarks.torch_ops                                   # every case, both exporters
    .venv/bin/python -m benchmarks.unseen_families   # whole models; this file: the operators inside them
    .venv/bin/python -m benchmarks.torch_ops --cases topk,lstm --exporters dynamo

A case is a function of one input ``x`` -- a sequence ``[batch, seq, 16]`` or an image ``[batch, 16,
h, w]`` with every axis but the channels dynamic -- and sometimes a submodule (``nn.LSTM``,
``nn.GroupNorm``). Each is exported with the TorchScript (opset 17) and/or the dynamo (opset 20)
exporter, compiled with ``tscomp compile`` (``--budget``), and run beside onnxruntime at four shapes
including 1 and the range ends; a row says the stage reached (export, compile, done), whether every
output matched at rtol = atol = 1e-4 (NaN where onnxruntime has NaN), the ONNX operators of the
export, and the groups left on the numpy fallback. No timing: this measures coverage. Export
failures are the exporters' (torch has no ONNX form for the op, or the exporter fails), reported
as such. Both exporters over every case take ~6 minutes here.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

C = 16
SEQ = {"batch": (1, 4), "seq": (1, 40)}
IMG = {"batch": (1, 4), "h": (3, 24), "w": (3, 24)}
IMG_EVEN = {"batch": (1, 4), "h": (2, 24), "w": (2, 24)}
SHAPES = {"seq": [(1, 1, C), (3, 13, C), (4, 40, C), (1, 7, C)],
          "img": [(1, C, 3, 3), (2, C, 24, 5), (4, C, 11, 24), (1, C, 24, 24)],
          "img_even": [(1, C, 2, 2), (2, C, 24, 6), (1, C, 10, 24)]}
DIMS = {"seq": SEQ, "img": IMG, "img_even": IMG_EVEN}


def cases():
    """name -> (function of (module, x), input kind, submodules or None)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    return {
        "hardswish": (lambda s, x: F.hardswish(x), "seq", None),
        "mish": (lambda s, x: F.mish(x), "seq", None),
        "selu": (lambda s, x: F.selu(x), "seq", None),
        "celu": (lambda s, x: F.celu(x, 0.7), "seq", None),
        "logsigmoid": (lambda s, x: F.logsigmoid(x), "seq", None),
        "softshrink": (lambda s, x: F.softshrink(x, 0.3), "seq", None),
        "hardtanh": (lambda s, x: F.hardtanh(x, -0.5, 0.7), "seq", None),
        "threshold": (lambda s, x: F.threshold(x, 0.1, 2.0), "seq", None),
        "hyperbolic": (lambda s, x: torch.asinh(x) + torch.sinh(x * 0.1) + torch.cosh(x * 0.1), "seq", None),
        "glu": (lambda s, x: F.glu(x, dim=-1), "seq", None),
        "silu_sigmoid": (lambda s, x: F.silu(x) * x.sigmoid(), "seq", None),
        "clamp": (lambda s, x: x.clamp(min=0.1) + x.clamp(max=-0.1), "seq", None),
        "where_scalar": (lambda s, x: torch.where(x > 0, x, 0.2 * x), "seq", None),
        "masked_fill": (lambda s, x: x.masked_fill(x > 0.5, -1e4), "seq", None),
        "rsqrt_pow": (lambda s, x: torch.rsqrt(x.abs() + 1) + x.abs().pow(1.5), "seq", None),
        "remainder_fmod": (lambda s, x: torch.remainder(x, 0.7) + torch.fmod(x, 0.7), "seq", None),
        "floor_trunc_div": (lambda s, x: torch.div(x, 0.3, rounding_mode="floor")
                            + torch.div(x, 0.3, rounding_mode="trunc"), "seq", None),
        "atan2": (lambda s, x: torch.atan2(x, x.flip(-1) + 0.5), "seq", None),
        "erf_exp": (lambda s, x: torch.special.erf(x) * torch.exp(-x * x), "seq", None),
        "normalize": (lambda s, x: F.normalize(x, dim=-1), "seq", None),
        "var": (lambda s, x: x.var(dim=-1, keepdim=True), "seq", None),
        "min_max_std": (lambda s, x: x.amax(dim=1) + x.amin(dim=1) + x.std(dim=1), "seq", None),
        "logsumexp": (lambda s, x: torch.logsumexp(x, dim=1), "seq", None),
        "rms_norm": (lambda s, x: s.m["r"](x), "seq", {"r": nn.RMSNorm(C)}),
        "topk": (lambda s, x: torch.topk(x, 3, dim=-1).values, "seq", None),
        "sort": (lambda s, x: torch.sort(x, dim=-1).values, "seq", None),
        "argsort": (lambda s, x: torch.argsort(x, dim=1).float(), "seq", None),
        "cumsum_flip": (lambda s, x: torch.cumsum(x.flip(1), 1), "seq", None),
        "cumprod": (lambda s, x: torch.cumprod(x * 0.1 + 1, dim=1), "seq", None),
        "flip": (lambda s, x: torch.flip(x, dims=[1]), "seq", None),
        "roll": (lambda s, x: torch.roll(x, 2, dims=1), "seq", None),
        "tril_outer": (lambda s, x: torch.tril(x[..., :1] * x[..., :1].transpose(1, 2)), "seq", None),
        "attention_bmm": (lambda s, x: torch.softmax(x @ x.transpose(1, 2) / 4, -1) @ x, "seq", None),
        "conv1d_grouped": (lambda s, x: s.m["c"](x.transpose(1, 2)).transpose(1, 2), "seq",
                           {"c": nn.Conv1d(C, C, 5, padding=2, groups=4)}),
        "lstm": (lambda s, x: s.m["l"](x)[0], "seq", {"l": nn.LSTM(C, 8, batch_first=True)}),
        "gru_bidirectional": (lambda s, x: s.m["l"](x)[0], "seq", {"l": nn.GRU(C, 8, batch_first=True,
                                                                                bidirectional=True)}),
        "pixel_shuffle": (lambda s, x: F.pixel_shuffle(x, 2), "img", None),
        "pixel_unshuffle": (lambda s, x: F.pixel_unshuffle(x, 2), "img_even", None),
        "group_norm": (lambda s, x: s.m["g"](x), "img", {"g": nn.GroupNorm(4, C)}),
        "instance_norm": (lambda s, x: s.m["i"](x), "img", {"i": nn.InstanceNorm2d(C, affine=True)}),
        "channels_last_layer_norm": (lambda s, x: F.layer_norm(x.permute(0, 2, 3, 1), (C,)).permute(0, 3, 1, 2),
                                     "img", None),
        "local_response_norm": (lambda s, x: F.local_response_norm(x, 3), "img", None),
        "prelu": (lambda s, x: s.m["p"](x), "img", {"p": nn.PReLU(C)}),
        "conv_transpose": (lambda s, x: s.m["c"](x), "img", {"c": nn.ConvTranspose2d(C, 8, 4, 2, 1)}),
        "avg_pool_ceil": (lambda s, x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False), "img", None),
        "max_pool_dilated": (lambda s, x: F.max_pool2d(x, 3, 2, 1, dilation=2), "img", None),
        "max_pool_residual": (lambda s, x: F.max_pool2d(x, 3, 1, 1) - x, "img", None),
        "lp_pool": (lambda s, x: F.lp_pool2d(x, 2, 2), "img_even", None),
        "adaptive_avg_1": (lambda s, x: F.adaptive_avg_pool2d(x, (1, 1)), "img", None),
        "adaptive_avg_3": (lambda s, x: F.adaptive_avg_pool2d(x, (3, 3)), "img", None),
        "interpolate_bilinear": (lambda s, x: F.interpolate(x, scale_factor=2, mode="bilinear"), "img", None),
        "interpolate_nearest": (lambda s, x: F.interpolate(x, scale_factor=2, mode="nearest"), "img", None),
        "grid_sample": (lambda s, x: F.grid_sample(x, torch.tanh(x[:, :2].permute(0, 2, 3, 1)),
                                                   align_corners=False), "img", None),
        "unfold": (lambda s, x: F.unfold(x, 3, padding=1), "img", None),
    }


def _export(name: str, exporter: str, out: Path) -> Path:
    import torch
    import torch.nn as nn

    fn, kind, subs = cases()[name]

    class Case(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = nn.ModuleDict(subs or {})

        def forward(self, x):
            return fn(self, x)

    torch.manual_seed(0)
    model = Case().eval()
    axes = {0: "batch", 1: "seq"} if kind == "seq" else {0: "batch", 2: "h", 3: "w"}
    example = torch.randn(2, 5, C) if kind == "seq" else torch.randn(2, C, 10, 14)
    path = out / f"{name}-{exporter}.onnx"
    if exporter == "dynamo":
        dims = DIMS[kind]
        shapes = {"x": {a: torch.export.Dim(n, min=dims[n][0], max=dims[n][1]) for a, n in axes.items()}}
        torch.onnx.export(model, (example,), str(path), dynamo=True, dynamic_shapes=shapes, input_names=["x"],
                          output_names=["y"])
    else:
        torch.onnx.export(model, (example,), str(path), dynamo=False, dynamic_axes={"x": axes, "y": {0: "batch"}},
                          input_names=["x"], output_names=["y"])
    return path


def run_case(name: str, exporter: str, out: Path, budget: str) -> dict:
    import onnx
    import onnxruntime as ort

    row = {"case": name, "exporter": exporter}
    kind = cases()[name][1]
    try:
        path = _export(name, exporter, out)
    except Exception as exc:  # noqa: BLE001 - the exporter's failure is this row's result
        return row | {"stage": "export", "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"}
    row["onnx_ops"] = sorted({n.op_type for n in onnx.load(str(path)).graph.node})
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    checks = []          # (input, onnxruntime's output); an export onnxruntime cannot run is the exporter's failure
    for shape in SHAPES[kind]:
        x = rng.standard_normal(shape).astype(np.float32)
        try:
            checks.append((x, sess.run(None, {"x": x})[0]))
        except Exception as exc:  # noqa: BLE001
            return row | {"stage": "export", "error": f"onnxruntime cannot run the export at {shape}: "
                                                      f"{type(exc).__name__}"}
    art = out / f"{name}-{exporter}.tsc"
    cmd = [sys.executable, "-m", "tscomp.cli", "compile", str(path), "-o", str(art), "--budget", budget]
    for k, (lo, hi) in DIMS[kind].items():
        cmd += ["--dim", f"{k}={lo}:{hi}"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return row | {"stage": "compile", "error": (done.stderr or done.stdout).strip().splitlines()[-1][:240]}
    from tscomp.runtime import Runtime
    rt = Runtime(str(art), num_threads=2)
    bad = []
    for x, want in checks:
        shape = x.shape
        try:
            got = rt.run({"x": x})["y"]
        except Exception as exc:  # noqa: BLE001
            bad.append(f"{shape}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-4, equal_nan=True):
            bad.append(f"{shape}: " + (f"shape {got.shape} vs {want.shape}" if got.shape != want.shape
                                       else f"max abs diff {np.nanmax(np.abs(got - want)):.2e}"))
    numpy_groups = [g for g, ks in rt.model.kernels.items() if all(k.target == "numpy" for k in ks)]
    return row | {"stage": "done", "ok": not bad, "problems": bad, "numpy_groups": numpy_groups}


def row_text(r: dict) -> str:
    head = f"{r['case']:>26} {r['exporter']:>11}  "
    if r["stage"] != "done":
        return head + f"{r['stage']} failed: {r['error']}"
    status = "ok" if r["ok"] else "MISMATCH " + "; ".join(r["problems"])
    numpy = f"  numpy groups {len(r['numpy_groups'])}" if r["numpy_groups"] else ""
    return head + f"{status:>8}{numpy}  ({', '.join(r['onnx_ops'])})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--exporters", default="torchscript,dynamo")
    ap.add_argument("--budget", default="1,10s", help="tscomp compile --budget")
    ap.add_argument("--out", default="", help="write the rows as JSON")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:       # one case in its own process: an exporter crash is a row, not the end
        name, exporter, out = args.child
        print(json.dumps(run_case(name, exporter, Path(out), args.budget)))
        return
    names = args.cases.split(",") if args.cases else list(cases())
    rows = []
    with tempfile.TemporaryDirectory(prefix="tscomp-torch-ops-") as tmp:
        for exporter in args.exporters.split(","):
            for name in names:
                cmd = [sys.executable, "-m", "benchmarks.torch_ops", "--budget", args.budget, "--child", name,
                       exporter, tmp]
                done = subprocess.run(cmd, capture_output=True, text=True)
                lines = done.stdout.strip().splitlines()
                try:
                    row = json.loads(lines[-1])
                except (IndexError, json.JSONDecodeError):
                    row = {"case": name, "exporter": exporter, "stage": "crash",
                           "error": (done.stderr.strip().splitlines() or ["no output"])[-1][:240]}
                rows.append(row)
                print(row_text(row), flush=True)
    done_rows = [r for r in rows if r["stage"] == "done"]
    print(f"{len(rows)} exports: {sum(r['stage'] != 'export' for r in rows)} exported, {len(done_rows)} compiled, "
          f"{sum(r['ok'] for r in done_rows)} match onnxruntime, "
          f"{sum(bool(r['numpy_groups']) for r in done_rows)} with numpy groups")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
