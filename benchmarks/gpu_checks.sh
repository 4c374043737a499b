#!/bin/bash
# Every check of the CUDA target that needs a GPU, in one run (a session lent a GPU has minutes of
# it): the SIMT test suite on the GPU, compute-sanitizer over the kernel tests, the GEMM
# configurations timed beside cuBLAS (calibration data for benchmarks/cuda_model_calibration.py),
# and --measure-gpu against the analytic compile end to end. Each step is time-boxed; logs and
# JSON go to $OUT (default ./gpu-checks). Needs the `cuda` extra (cuda-bindings), nvcc, onnxruntime
# and the tiny BERT export in $TSCOMP_MODEL_CACHE (default .cache/models).
#   bash benchmarks/gpu_checks.sh [tests|sanitizer|gemm|measured|all]
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/gpu-checks}; mkdir -p "$OUT"
MODELS=${TSCOMP_MODEL_CACHE:-$PWD/.cache/models}
STEP=${1:-all}
nvidia-smi -L; nvcc --version | tail -1
if [[ $STEP == all || $STEP == tests ]]; then
  echo "== SIMT suite on the GPU"
  TSCOMP_SIMT_DEVICE=cuda TSCOMP_SIMT_ALL_MODELS=1 timeout 240 python3 -m pytest -q -n 8 -p no:cacheprovider \
    tests/codegen/simt tests/runtime/test_device_opencl.py tests/schedule/test_gpu_schedule.py > "$OUT/tests.log" 2>&1
  grep -E "passed|failed|^FAILED|^ERROR" "$OUT/tests.log" | tail -8
fi
if [[ $STEP == all || $STEP == sanitizer ]]; then
  echo "== compute-sanitizer memcheck over the kernel tests"
  TSCOMP_SIMT_DEVICE=cuda timeout 180 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q \
    -p no:cacheprovider tests/codegen/simt/test_gemm.py tests/codegen/simt/test_index.py tests/codegen/simt/test_conv.py \
    > "$OUT/sanitizer.log" 2>&1; echo "sanitizer rc $?"; grep "ERROR SUMMARY" "$OUT/sanitizer.log"
fi
if [[ $STEP == all || $STEP == gemm ]]; then
  echo "== GEMM configurations timed beside cuBLAS"
  timeout 150 python3 -m benchmarks.cuda_gemm_measured --top 12 --sample 40 --ms 16,128,2048,16384 --reps 6 \
    --json "$OUT/gemm_sample.json" > "$OUT/gemm.log" 2>&1; tail -17 "$OUT/gemm.log"
  python3 -m benchmarks.cuda_model_calibration --data "$OUT/gemm_sample.json" --plot "$OUT/calibration.png" | tail -4
fi
if [[ $STEP == all || $STEP == measured ]]; then
  echo "== --measure-gpu against the analytic compile"
  timeout 150 python3 -m benchmarks.cuda_measured_vs_analytic --synthetic --shapes 1,16,128,512,2048,4096 \
    > "$OUT/measured_synthetic.log" 2>&1; tail -9 "$OUT/measured_synthetic.log"
  timeout 120 python3 -m benchmarks.cuda_measured_vs_analytic --model "$MODELS/bert-tiny-dynamo.onnx" \
    --dim batch=1:8 --dim sequence=1:512 --shapes "batch=1,sequence=1;batch=1,sequence=128;batch=3,sequence=97;batch=8,sequence=512" \
    > "$OUT/measured_bert.log" 2>&1; tail -6 "$OUT/measured_bert.log"
fi
