"""Exhaustive check of the generated C's division by a constant (:data:`tscomp.codegen.c_expr.QUOTIENT_HELPER`):
for each of ``--scales`` scales (two from models, then random mantissas over 2^-30 .. 2^10), every
float x with |x / s| < 70000 (both signs) and 2^28 bit patterns spread over the whole range are
divided both ways; a row counts the x (|x| >= 1e-28, no overflow) where the FMA-corrected product
differs from the division. Both cores, ~8 s per scale; nothing else should run meanwhile.

    .venv/bin/python -m benchmarks.quotient_exhaustive --scales 24
"""
import argparse
import pathlib
import re
import subprocess
import tempfile

from tscomp.codegen.build import compiler
from tscomp.codegen.c_expr import QUOTIENT_HELPER

CHECK = r"""
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
static inline float bits(uint32_t u){union{uint32_t u; float f;} v; v.u = u; return v.f;}
HELPER
static inline float fast_div(float x, float s, float r) { return ts_quotient(x, s, r); }
int main(int argc, char** argv){
  int nscales = atoi(argv[1]); unsigned seed = 12345; long total_bad = 0;
  for (int k = 0; k < nscales; ++k) {
    seed = seed * 1103515245u + 12345u;
    float s = (k == 0) ? 0.039286155f : (k == 1) ? 1.0f/3.0f : ldexpf(1.0f + (seed >> 9) / 8388608.0f, (int)((seed >> 3) % 40) - 30);
    const float r = 1.0f / s;
    long bad = 0, badr = 0;
    float L = 70000.0f * s; uint32_t lim; memcpy(&lim, &L, 4);
    #pragma omp parallel for simd reduction(+:bad) schedule(static)
    for (int64_t u = 0; u <= (int64_t)lim; ++u) {
      float x = bits((uint32_t)u);
      float w = x / s;
      int normal = fabsf(x) >= 1e-28f;
      bad += normal && fast_div(x, s, r) != w;
      bad += normal && fast_div(-x, s, r) != -w;
    }
    #pragma omp parallel for simd reduction(+:badr) schedule(static)
    for (int64_t i = 0; i < (1 << 28); ++i) {
      uint32_t u = (uint32_t)(i * 2654435761u) ^ (uint32_t)(i >> 3);
      float x = bits(u), w = x / s, g = fast_div(x, s, r);
      int both_nan = (w != w) && (g != g);
      int extreme = fabsf(w) > 1e37f || fabsf(x) < 1e-28f || fabsf(x) > 1e37f;
      badr += !both_nan && !extreme && w != g;
    }
    printf("scale %.9g: range %u floats, %ld differ; random 2^28: %ld differ (extremes excluded)\n", s, lim, bad, badr);
    fflush(stdout);
    total_bad += bad + badr;
  }
  printf("total differing %ld\n", total_bad);
}
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scales", type=int, default=24)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = pathlib.Path(tmp) / "check.c", pathlib.Path(tmp) / "check"
        # the helper exactly as kernels include it, its `omp declare simd` pragma dropped
        src.write_text(CHECK.replace("HELPER", re.sub(r"#pragma omp declare simd[^\n]*\n", "", QUOTIENT_HELPER)))
        subprocess.run([compiler(), "-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno",
                        str(src), "-o", str(exe), "-lm"], check=True)
        subprocess.run([str(exe), str(args.scales)], check=True)


if __name__ == "__main__":
    main()
