"""BERT-base's GEMM groups on the CUDA target without a GPU (issue 9, acceptance 6): per
architecture the analytic ranking's top SIMT configuration (TSCompiler §5.1 tiles; FTuner/DietCode
style score), its predicted occupancy, the ptxas resources of its kernel (nvcc), and on sm_80 the
wave model's choice among the compiled variants at M = 1, 16, 128, 512 sequences x 128 tokens.

Analytic and nvcc only (nothing is timed):  python benchmarks/cuda_analytic_ranking.py [--json out.json]
"""
from __future__ import annotations

import argparse
import json

from tscomp.codegen.cpu_gemm import Epilogue
from tscomp.codegen.nvcc import compile_cubin
from tscomp.codegen.simt.gemm import SimtEpilogue, gemm_body
from tscomp.codegen.simt.program import SimtProgram
from tscomp.schedule.gpu_space import GpuGemmSpace, gemm_cost
from tscomp.schedule.target import cuda

#: (name, K, N, fused epilogue) of BERT-base's GEMM groups (hidden 768, FFN 3072, fused QKV)
GROUPS = [("QKV + bias", 768, 2304, Epilogue.bias()), ("attention out + bias + residual", 768, 768,
          Epilogue.bias_residual()), ("FFN up + bias + GELU", 768, 3072, Epilogue.bias_gelu()),
          ("FFN down + bias + residual", 3072, 768, Epilogue.bias_residual())]
M_RANGE = (1, 512 * 128)
M_REPORT = (1 * 128, 16 * 128, 128 * 128, 512 * 128)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--archs", default="sm_80,sm_90")
    args = ap.parse_args()
    rows = []
    for arch in args.archs.split(","):
        spec = cuda(arch).spec
        for name, K, N, epi in GROUPS:
            space = GpuGemmSpace(K, N, cuda(arch), M_RANGE)
            top = space.rank(1)[0]
            t = top.tile
            prog = SimtProgram("/* report */\n", gemm_body("k", t, K, N, SimtEpilogue.from_cpu(epi)),
                               {"TS_WANT_ASYNC": 1} if t.async_copy else {})
            res = compile_cubin(prog.cuda, arch).resources["k"]
            occ = spec.occupancy({"threads": t.threads, "registers": res.registers, "shared_bytes": res.shared_bytes})
            row = {"arch": arch, "group": name, "K": K, "N": N, "top": t.slug(), "score": round(top.score, 3),
                   "occupancy_predicted": round(top.occupancy, 3), "registers_estimate": top.registers,
                   "ptxas": res.to_json(), "occupancy_with_ptxas_registers": round(occ, 3)}
            if arch == "sm_80":
                variants = space.variants(3)
                row["variants"] = [v.slug() for v in variants]
                row["wave_choice"] = {str(m): min(variants, key=lambda v: gemm_cost(spec, v, m, K, N)).slug()
                                      for m in M_REPORT}
            rows.append(row)
            print(f"{arch} {name:34s} K={K:4d} N={N:4d} top {t.slug():32s} score {top.score:.3f} "
                  f"occ(pred) {top.occupancy:.2f} ptxas regs {res.registers} smem {res.shared_bytes} "
                  f"spills {res.spill_stores + res.spill_loads} occ(ptxas) {occ:.2f}")
            if "wave_choice" in row:
                print("      sm_80 wave model: " + ", ".join(f"M={m}: {c}" for m, c in row["wave_choice"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
