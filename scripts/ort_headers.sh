#!/usr/bin/env bash
# Provides the ONNX Runtime C/C++ headers that dcnkit's custom-op library builds against (the onnxruntime
# pip wheel ships none) and prints their include directory on stdout (messages go to stderr).
#
#   bash scripts/ort_headers.sh DEPS_DIR [PYTHON]
#
# 1. DCNKIT_ORT_INCLUDE_DIR set: it must hold onnxruntime_cxx_api.h; it is used as is, nothing is fetched.
# 2. DEPS_DIR/onnxruntime/include already holds the headers (an earlier run): used as is.
# 3. Otherwise Debian trixie's libonnxruntime-dev is downloaded with apt-get (as the current user, into
#    DEPS_DIR/apt, nothing installed) from the Debian archive this machine's apt is configured with
#    (scripts/apt_debian_url.py reads its sources, both formats), and its headers are unpacked.
#    Without apt-get, or without a Debian archive in apt's sources, one line says what to provide; exit 1.
#
# For tests: DCNKIT_APT_SOURCES_LIST / DCNKIT_APT_SOURCES_PARTS replace the paths apt-config reports.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
deps="${1:?usage: ort_headers.sh DEPS_DIR [PYTHON]}"
py="${2:-python3}"
header=onnxruntime_cxx_api.h
need="set DCNKIT_ORT_INCLUDE_DIR to a directory holding ONNX Runtime's C/C++ headers ($header, onnxruntime_c_api.h, ...; e.g. the include/ folder of an onnxruntime release archive)"
say() { printf '[ort-headers] %s\n' "$*" >&2; }

if [ -n "${DCNKIT_ORT_INCLUDE_DIR:-}" ]; then
  if [ ! -f "$DCNKIT_ORT_INCLUDE_DIR/$header" ]; then
    say "error: DCNKIT_ORT_INCLUDE_DIR=$DCNKIT_ORT_INCLUDE_DIR has no $header: $need"
    exit 1
  fi
  say "using DCNKIT_ORT_INCLUDE_DIR=$DCNKIT_ORT_INCLUDE_DIR (nothing fetched)"
  (cd "$DCNKIT_ORT_INCLUDE_DIR" && pwd)
  exit 0
fi

inc="$deps/onnxruntime/include"
if [ -f "$inc/$header" ]; then
  (cd "$inc" && pwd)
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  say "error: no apt-get on this machine to fetch Debian's libonnxruntime-dev: $need"
  exit 1
fi

# Where this machine's apt reads its sources (apt.conf may move them).
sources_list="${DCNKIT_APT_SOURCES_LIST:-}"
sources_parts="${DCNKIT_APT_SOURCES_PARTS:-}"
if [ -z "$sources_list" ] || [ -z "$sources_parts" ]; then
  SL=/etc/apt/sources.list SP=/etc/apt/sources.list.d
  if command -v apt-config >/dev/null 2>&1; then
    eval "$(apt-config shell SL Dir::Etc::SourceList/f SP Dir::Etc::SourceParts/d)"
  fi
  sources_list="${sources_list:-$SL}"
  sources_parts="${sources_parts:-$SP}"
fi
if ! line="$("$py" "$here/apt_debian_url.py" --sources-list "$sources_list" --sources-parts "$sources_parts" \
             --suite trixie --component main)"; then
  say "error: this machine's apt has no Debian archive to fetch libonnxruntime-dev (trixie) from: $need"
  exit 1
fi

say "fetching libonnxruntime-dev (headers only) with: $line"
work="$deps/apt"
# shellcheck source=scripts/apt_fetch.sh
. "$here/apt_fetch.sh"
apt_fetch_unpack "$work" "$line" libonnxruntime-dev
debs=("$work"/deb/libonnxruntime-dev_*.deb)
if [ ! -f "${debs[0]}" ]; then
  say "error: apt-get download libonnxruntime-dev left no .deb in $work/deb: $need"
  exit 1
fi
if [ ! -f "$work/x/usr/include/onnxruntime/$header" ]; then
  say "error: ${debs[0]} has no usr/include/onnxruntime/$header: $need"
  exit 1
fi
mkdir -p "$inc"
cp -r "$work/x/usr/include/onnxruntime/." "$inc/"
(cd "$inc" && pwd)
