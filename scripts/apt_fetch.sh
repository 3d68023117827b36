# Sourced by scripts/ort_headers.sh, scripts/onednn_fetch.sh and scripts/cuda12_fetch.sh (not run alone).
#
# apt_debian_line PYTHON SUITE COMPONENTS: one sources.list line for SUITE / COMPONENTS of the Debian archive this
# machine's apt uses (its sources, DCNKIT_APT_SOURCES_LIST / _PARTS override them; scripts/apt_debian_url.py);
# non-zero when apt has no Debian archive.
#
# fetch_args NAME DEPS_DIR [PYTHON]: the arguments of scripts/NAME_fetch.sh: sets deps (DEPS_DIR, created, absolute)
# and py (PYTHON, default python3), and defines say MESSAGE (one "[NAME] MESSAGE" line on stderr).
#
# apt_fetch_unpack WORK LINE PKG...: downloads the packages with apt-get as the current user, from the one
# sources.list LINE, into WORK/deb (apt's lists and cache in WORK too; nothing installed) and unpacks every
# .deb into WORK/x. apt-get's messages go to stderr.
fetch_args() {
  local name="$1"
  deps="${2:?usage: ${name}_fetch.sh DEPS_DIR [PYTHON]}"
  mkdir -p "$deps" && deps="$(cd "$deps" && pwd)"
  py="${3:-python3}"
  eval "say() { printf '[$name] %s\\n' \"\$*\" >&2; }"
}

apt_fetch_unpack() {
  local work="$1" line="$2"
  shift 2
  mkdir -p "$work" && work="$(cd "$work" && pwd)"  # apt-get runs from WORK/deb: absolute paths
  rm -rf "$work/deb" "$work/x"
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/deb" "$work/x"
  printf '%s\n' "$line" > "$work/sources.list"
  local apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
                  -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache" -o "APT::Get::List-Cleanup=0")
  apt-get "${apt_opts[@]}" -qq update >&2
  (cd "$work/deb" && apt-get "${apt_opts[@]}" -qq download "$@" >&2)
  local d
  for d in "$work"/deb/*.deb; do
    if [ -f "$d" ]; then dpkg-deb -x "$d" "$work/x"; fi
  done
}

apt_debian_line() {
  local py="$1" suite="$2" components="$3"
  local SL=/etc/apt/sources.list SP=/etc/apt/sources.list.d
  if command -v apt-config >/dev/null 2>&1; then
    eval "$(apt-config shell SL Dir::Etc::SourceList/f SP Dir::Etc::SourceParts/d)"
  fi
  "$py" "$(dirname "${BASH_SOURCE[0]}")/apt_debian_url.py" --sources-list "${DCNKIT_APT_SOURCES_LIST:-$SL}" \
    --sources-parts "${DCNKIT_APT_SOURCES_PARTS:-$SP}" --suite "$suite" --component "$components"
}
