#!/usr/bin/env bash
# Provides a CUDA 12 compiler for the CUDA 12 compile check of the kernels (tests/test_cuda12_compile.py; Jetson's
# JetPack 6 and many containers are CUDA 12) and prints the toolkit's folder on stdout (messages go to stderr).
#
#   bash scripts/cuda12_fetch.sh DEPS_DIR [PYTHON]
#
# PyPI's CUDA 12 wheels carry no nvcc (nvidia-cuda-nvcc-cu12 holds ptxas, the crt headers and libnvvm only), so the
# compiler drivers (nvcc, cudafe++, cicc, ptxas, fatbinary, nvlink, libdevice) come from Debian trixie's
# nvidia-cuda-toolkit 12.4.131 (non-free), downloaded with apt-get as the current user from the Debian archive this
# machine's apt uses (scripts/apt_debian_url.py), nothing installed; the headers from PyPI: nvidia-cuda-nvcc-cu12
# 12.4.131 (crt), nvidia-cuda-runtime-cu12 12.4.127 and nvidia-cuda-cccl-cu12 12.6.77 (thrust, cub, libcu++ with
# <nv/target>, which 12.4's wheel lacks). They are laid out as one toolkit in DEPS_DIR/cuda12 with an nvcc.profile
# of its own. It compiles (-c); nothing here links or runs CUDA 12 code. An earlier run's copy is reused. Without
# apt-get, a Debian archive or PyPI it says so in one line and exits 1 (the check then skips).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/apt_fetch.sh
. "$here/apt_fetch.sh"
fetch_args cuda12 "$@"
out="$deps/cuda12"
if [ -x "$out/bin/nvcc" ] && [ -f "$out/include/cuda_runtime.h" ] && [ -f "$out/include/nv/target" ]; then
  echo "$out"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  say "error: no apt-get on this machine to fetch Debian's nvidia-cuda-toolkit (nvcc 12)"
  exit 1
fi
if ! line="$(apt_debian_line "$py" trixie "main non-free")"; then
  say "error: this machine's apt has no Debian archive to fetch nvidia-cuda-toolkit (trixie non-free) from"
  exit 1
fi
say "fetching nvidia-cuda-toolkit 12.4 with: $line"
work="$deps/apt-cuda12"
apt_fetch_unpack "$work" "$line" nvidia-cuda-toolkit
x="$work/x"
if [ ! -x "$x/usr/lib/nvidia-cuda-toolkit/bin/nvcc" ]; then
  say "error: the fetched nvidia-cuda-toolkit holds no nvcc"
  exit 1
fi
say "fetching the CUDA 12 headers from PyPI"
wheels="$deps/cuda12-wheels"
rm -rf "$wheels"
"$py" -m pip install -q --no-deps --target "$wheels" nvidia-cuda-nvcc-cu12==12.4.131 \
  nvidia-cuda-runtime-cu12==12.4.127 nvidia-cuda-cccl-cu12==12.6.77 >&2
rm -rf "$out.tmp"
mkdir -p "$out.tmp/bin" "$out.tmp/include" "$out.tmp/nvvm/libdevice"
cp "$x/usr/lib/nvidia-cuda-toolkit/bin/nvcc" "$x/usr/lib/nvidia-cuda-toolkit/bin/cicc" "$out.tmp/bin/"
for b in cudafe++ ptxas fatbinary nvlink bin2c; do cp "$x/usr/bin/$b" "$out.tmp/bin/"; done
cp "$x/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc" "$out.tmp/nvvm/libdevice/"
for p in cuda_nvcc cuda_runtime cuda_cccl; do cp -r "$wheels/nvidia/$p/include/." "$out.tmp/include/"; done
rm -rf "$out.tmp/include/__pycache__" "$out.tmp/include/__init__.py"
cat > "$out.tmp/bin/nvcc.profile" <<'PROFILE'
TOP                = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
PATH              += $(_HERE_):
INCLUDES          +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES          =+ $(_SPACE_)
PROFILE
rm -rf "$out" "$work" "$wheels"
mv "$out.tmp" "$out"
"$out/bin/nvcc" --version | tail -1 >&2
echo "$out"
