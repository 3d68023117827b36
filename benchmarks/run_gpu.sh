#!/usr/bin/env bash
# Every benchmark on the GPU (run by .ci/gpu after its build and tests): the same tables as on the CPU, with
# cuDNN conv2d as the dense baseline, float32 and float16, ONNX Runtime's CUDA execution provider when
# onnxruntime has it, and TensorRT engines when the tensorrt package is importable.
# Environment: PYTHON (default python3). Exit status: non-zero when a benchmark failed.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
py="${PYTHON:-python3}"
out="build/gpu-bench"
mkdir -p "$out"
status=0
for b in bench_deform_conv2d bench_ort_deform_conv bench_roi_align bench_resnet50_dcn; do
  printf '\033[1m[gpu]\033[0m benchmarks/%s.py --device cuda\n' "$b"
  "$py" "benchmarks/$b.py" --device cuda --json "$out/$b.json" || status=$?
done
exit "$status"
