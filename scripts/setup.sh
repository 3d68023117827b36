#!/usr/bin/env bash
# Sets up a development/CI environment from scratch on a fresh machine:
#   - a virtual environment in .venv with PyTorch, ONNX, ONNX Runtime and the tools (NVIDIA Triton's server from
#     the nvidia-pytriton wheel included),
#   - ONNX Runtime C/C++ headers: DCNKIT_ORT_INCLUDE_DIR when set (nothing fetched), else Debian trixie's
#     libonnxruntime-dev (headers only, into .deps/) from the Debian archive this machine's apt already uses
#     (scripts/ort_headers.sh; without apt-get it says in one line what to provide and fails),
#   - oneDNN for the quantized DeformConv2d (Debian bookworm's libdnnl2 unpacked into .deps/onednn by
#     scripts/onednn_fetch.sh; optional: without it QDeformConv2d asks for oneDNN and its tests skip),
#   - oneDNN 3.x from PyPI (onednn-cpu-gomp, in requirements-dev.txt and the wheel's dependencies): the packed-weight
#     CPU GEMM of the ONNX Runtime and OpenVINO libraries, loaded at run time (without it: OpenBLAS, one line saying so),
#   - a CUDA 12 compiler in .deps/cuda12 when nvcc is here (scripts/cuda12_fetch.sh: the kernels' CUDA 12 compile
#     check; optional),
#   - the [openvino] extra (OpenVINO's wheel: the openvino backend, and the headers libdcnkit_ov.so is built with),
#   - dcnkit itself, built by scikit-build-core (CPU + CUDA when nvcc is present).
# Idempotent: a second run reuses what is there and only rebuilds dcnkit.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
py="$venv/bin/python"
log() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# ---- ONNX Runtime headers first (the pip wheel ships none): fail fast when they cannot be had ----
ort_inc="$(bash "$root/scripts/ort_headers.sh" "$root/.deps" python3)"
bash "$root/scripts/onednn_fetch.sh" "$root/.deps" python3 >/dev/null ||
  log "oneDNN not fetched: dcnkit::QDeformConv2d will need apt install libdnnl2 or DCNKIT_ONEDNN_LIB"
# A CUDA 12 compiler for tests/test_cuda12_compile.py (the kernels under CUDA 12 too; optional, where nvcc builds).
if [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
  bash "$root/scripts/cuda12_fetch.sh" "$root/.deps" python3 >/dev/null ||
    log "CUDA 12 toolkit not fetched: tests/test_cuda12_compile.py will skip"
fi

if [ ! -x "$py" ]; then
  log "creating $venv"
  python3 -m venv "$venv"
fi
"$py" -m pip install -q --upgrade pip
if ! "$py" -c "import torch, torchvision" 2>/dev/null; then
  log "installing torch 2.14.1 + torchvision 0.29.1"
  "$py" -m pip install -q torch==2.14.1 torchvision==0.29.1
fi
log "installing python dependencies"
"$py" -m pip install -q -r "$root/requirements-dev.txt"
# NVIDIA Triton (tritonserver 2.51 with its Python backend) for `dcnkit serve --engine triton` and its tests. Only
# the wheel's files are used (not PyTriton's Python API, whose metadata pins numpy<2): no dependencies.
"$py" -m pip install -q --no-deps nvidia-pytriton==0.7.0
# Ultralytics (tests/test_ultralytics.py: dcnkit.integrations.ultralytics) without its dependencies: its metadata asks
# for opencv-python (the GUI build; requirements-dev.txt has the headless one and the rest of what it imports).
"$py" -m pip install -q --no-deps ultralytics==8.4.190 ultralytics-thop==2.2.3
# The [openvino] extra (the openvino backend), before the build: its wheel's headers and CMake package build
# libdcnkit_ov.so.
log "installing the [openvino] extra"
"$py" -m pip install -q $("$py" -c 'import sys, tomllib; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["openvino"]))' "$root/pyproject.toml")

# ---- build and install dcnkit ----
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-7.5;8.0;9.0}"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export DCNKIT_ORT_INCLUDE_DIR="$ort_inc"
log "building and installing dcnkit"
"$py" -m pip install -q --no-build-isolation --no-deps -e "$root"
summary=$("$py" -c 'import dcnkit; print("dcnkit", dcnkit.__version__, "| CUDA kernels compiled:", dcnkit.cuda_compiled(), "| ORT library:", dcnkit.ort_library())')
log "done: $summary"
