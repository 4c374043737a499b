"""A volumetric model side by side with onnxruntime: a small 3-D U-Net whose 3-D Convs, pools and
up-convolutions tscomp compiles as 2-D ones (:mod:`tscomp.graph.volumetric`).

    .venv/bin/python -m benchmarks.volumetric_vs_onnxruntime [--samples 8] [--up transpose|trilinear]

The model (random weights, BatchNorm statistics from a batch, biases exercised so no epilogue is a
no-op): two encoder stages of Conv3d-BN-ReLU x 2 with MaxPool3d, a bottleneck, two decoder stages
that upsample (``ConvTranspose3d`` k = s = 2, or a trilinear ``Resize`` after a 1x1x1 Conv) and
concatenate the skip, and a 1x1x1 head. Exported with frames T, height H and width W dynamic
(multiples of 4: two poolings and two upsamplings must meet their skips), compiled by ``tscomp
compile`` with ``--budget``, then ``tscomp bench``'s table at ``--samples`` random (B, T, H, W):
latency of both, ratio, first call and the largest absolute difference. The compile summary's
``host program`` line says how many groups run natively (all of them: before the rewrite, 12 of 27).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

CACHE = Path(".cache/volumetric")
RANGES = {"B": (1, 2), "T": (4, 16), "H": (8, 48), "W": (8, 48)}


def build(up: str):
    import torch
    import torch.nn as nn

    def block(i, o):
        return nn.Sequential(nn.Conv3d(i, o, 3, padding=1), nn.BatchNorm3d(o), nn.ReLU(),
                             nn.Conv3d(o, o, 3, padding=1), nn.BatchNorm3d(o), nn.ReLU())

    class UNet3D(nn.Module):
        def __init__(s):
            super().__init__()
            s.e1, s.e2, s.mid = block(1, 8), block(8, 16), block(16, 32)
            s.pool = nn.MaxPool3d(2)
            if up == "transpose":
                s.u2, s.u1 = nn.ConvTranspose3d(32, 16, 2, stride=2), nn.ConvTranspose3d(16, 8, 2, stride=2)
            else:
                s.u2, s.u1 = nn.Conv3d(32, 16, 1), nn.Conv3d(16, 8, 1)
            s.d2, s.d1, s.head = block(32, 16), block(16, 8), nn.Conv3d(8, 3, 1)

        def up(s, conv, x):
            y = conv(x)
            return y if up == "transpose" else nn.functional.interpolate(y, scale_factor=2, mode="trilinear")

        def forward(s, x):
            a = s.e1(x)
            b = s.e2(s.pool(a))
            c = s.mid(s.pool(b))
            d = s.d2(torch.cat([s.up(s.u2, c), b], 1))
            return s.head(s.d1(torch.cat([s.up(s.u1, d), a], 1)))

    torch.manual_seed(0)
    model = UNet3D()
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim <= 1:
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm3d):
                m.momentum = 1.0
                m.train()
        model(torch.randn(2, 1, 8, 24, 24))
    return model.eval()


def export(up: str) -> Path:
    import torch
    path = CACHE / f"unet3d-{up}.onnx"
    if not path.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        torch.onnx.export(build(up), (torch.randn(1, 1, 8, 16, 16),), str(path), dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "B", 2: "T", 3: "H", 4: "W"}}, opset_version=17)
    return path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--up", default="transpose", choices=("transpose", "trilinear"))
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--budget", default="2,60s")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    onnx_path = export(args.up)
    artifact = CACHE / f"unet3d-{args.up}.tsc"
    cmd = [sys.executable, "-m", "tscomp.cli", "compile", str(onnx_path), "-o", str(artifact), "--budget", args.budget]
    for k, (lo, hi) in RANGES.items():
        cmd += ["--dim", f"{k}={lo}:{hi}"]
    subprocess.run(cmd, check=True)

    from tscomp.bench import bench, sample_bindings, table
    from tscomp.runtime import Runtime
    rt = Runtime(str(artifact), num_threads=args.threads)
    within = {k: (lo, hi, 4) for k, (lo, hi) in RANGES.items() if k != "B"}
    bindings = sample_bindings(rt, args.samples, 0, {}, within=within)
    print(f"3-D U-Net ({args.up} up-convolutions), {args.threads} threads")
    print("\n".join(table(bench(rt, str(onnx_path), bindings, threads=args.threads))))


if __name__ == "__main__":
    main()
