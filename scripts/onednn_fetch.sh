#!/usr/bin/env bash
# Provides oneDNN for the quantized operators of the ONNX Runtime library (QDeformConv2d's int8 GEMM, loaded at
# first use: plugins/onnxruntime/ort_onednn.h) and prints its lib directory on stdout (messages go to stderr).
#
#   bash scripts/onednn_fetch.sh DEPS_DIR [PYTHON]
#
# Debian bookworm's libdnnl2 and libdnnl-dev (oneDNN 2.6.3: a CPU build with OpenMP, its JIT picks AVX2, AVX-512
# VNNI or AMX-INT8 at run time) and ocl-icd-libopencl1 (libdnnl.so.2 needs libOpenCL.so.1) are downloaded with
# apt-get as the current user from the Debian archive this machine's apt uses (scripts/apt_debian_url.py, as
# scripts/ort_headers.sh does), nothing installed, and unpacked into DEPS_DIR/onednn/{lib,include}. Why not the
# PyPI `onednn` wheel: docs/quantization.md. An earlier run's copy is reused. Without apt-get or a Debian archive
# it says so in one line and exits 1 (the library still builds and loads; QDeformConv2d then asks for oneDNN).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/apt_fetch.sh
. "$here/apt_fetch.sh"
fetch_args onednn "$@"
out="$deps/onednn"
if [ -f "$out/lib/libdnnl.so.2" ] && [ -f "$out/include/oneapi/dnnl/dnnl.h" ]; then
  (cd "$out/lib" && pwd)
  exit 0
fi
need="install oneDNN (apt install libdnnl2) or set DCNKIT_ONEDNN_LIB to a libdnnl.so path"
if ! command -v apt-get >/dev/null 2>&1; then
  say "error: no apt-get on this machine to fetch Debian's libdnnl2: $need"
  exit 1
fi
if ! line="$(apt_debian_line "$py" bookworm "main")"; then
  say "error: this machine's apt has no Debian archive to fetch libdnnl2 (bookworm) from: $need"
  exit 1
fi
say "fetching libdnnl2, libdnnl-dev and ocl-icd-libopencl1 with: $line"
work="$deps/apt-onednn"
apt_fetch_unpack "$work" "$line" libdnnl2 libdnnl-dev ocl-icd-libopencl1
lib="$work/x/usr/lib/x86_64-linux-gnu"
if [ ! -f "$lib/libdnnl.so.2" ] || [ ! -f "$work/x/usr/include/oneapi/dnnl/dnnl.h" ]; then
  say "error: the fetched packages hold no libdnnl.so.2 / dnnl.h: $need"
  exit 1
fi
mkdir -p "$out/lib" "$out/include"
cp -L "$lib/libdnnl.so.2" "$lib/libOpenCL.so.1" "$out/lib/"
cp -r "$work/x/usr/include/." "$out/include/"
(cd "$out/lib" && pwd)
