#!/usr/bin/env python3
"""Finds the Debian archive this machine's apt is configured with, and prints one sources.list line for
the suite that carries ``libonnxruntime-dev`` (``trixie main`` by default) from that same archive.

Used by ``scripts/ort_headers.sh`` so that ``scripts/setup.sh`` fetches from the mirror the machine already
uses (a company mirror, a proxy, a snapshot) instead of an address written into the script.

Reads both apt formats, in the order apt reads them:

* one-line: ``deb [option=value ...] URI SUITE [COMPONENT ...]`` in ``sources.list`` and
  ``sources.list.d/*.list``;
* deb822: stanzas of ``Types:``, ``URIs:``, ``Suites:``, ``Components:``, ``Enabled:``, ``Signed-By:`` ...
  in ``sources.list.d/*.sources``.

An entry is a Debian archive when it is a ``deb`` (binary) entry, enabled, and one of its suites is a Debian
release name or alias (``bookworm``, ``trixie-updates``, ``stable``, ``sid`` ...), not a ``-security`` suite
(the security archive carries only security updates). The first such URI wins; ``signed-by`` is kept when it
names a keyring file. Standard library only; exit status 1 with one line on stderr when nothing fits.
"""
from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from dataclasses import dataclass, field

# Debian release code names and the archive's aliases for them.
DEBIAN_RELEASES = frozenset(
    "buzz rex bo hamm slink potato woody sarge etch lenny squeeze wheezy jessie stretch buster bullseye "
    "bookworm trixie forky duke sid oldoldstable oldstable stable testing unstable experimental".split()
)
# Suffixes of suites published in the main archive next to a release.
_MAIN_ARCHIVE_SUFFIXES = ("", "-updates", "-backports", "-backports-sloppy", "-proposed-updates")


@dataclass
class Source:
    """One apt source: the entry's types, URIs, suites, components and options as written."""

    types: list[str]
    uris: list[str]
    suites: list[str]
    components: list[str] = field(default_factory=list)
    options: dict[str, str] = field(default_factory=dict)
    origin: str = ""  # file:line, for messages


def _strip_comment(line: str) -> str:
    return line.split("#", 1)[0].strip()


def parse_one_line(text: str, origin: str = "") -> list[Source]:
    """The entries of a one-line-format file (``sources.list``, ``*.list``)."""
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw)
        if not line:
            continue
        # Options: "[a=b c=d]" right after the type; the brackets may hold spaces.
        m = re.fullmatch(r"(\S+)\s+(?:\[([^\]]*)\]\s*)?(\S+)\s+(\S+)(?:\s+(.*))?", line)
        if not m:
            continue
        typ, opts, uri, suite, comps = m.groups()
        options = {}
        for item in (opts or "").split():
            if "=" in item:
                k, v = item.split("=", 1)
                options[k.strip().lower()] = v.strip()
        out.append(Source([typ], [uri], [suite], (comps or "").split(), options, f"{origin}:{n}"))
    return out


def parse_deb822(text: str, origin: str = "") -> list[Source]:
    """The entries of a deb822-format file (``*.sources``): stanzas separated by blank lines, fields
    ``Name: value`` with continuation lines starting with white space, ``#`` lines are comments."""
    stanzas: list[tuple[int, dict[str, str]]] = []
    fields: dict[str, str] = {}
    start, last = 0, None
    for n, raw in enumerate(text.splitlines(), 1):
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if fields:
                stanzas.append((start, fields))
            fields, last = {}, None
            continue
        if raw[0] in " \t":
            if last is not None:  # continuation (a multi-line value such as an embedded key)
                fields[last] += "\n" + raw.strip()
            continue
        if ":" not in raw:
            continue
        name, value = raw.split(":", 1)
        if not fields:
            start = n
        last = name.strip().lower()
        fields[last] = value.strip()
    if fields:
        stanzas.append((start, fields))
    out = []
    for start, f in stanzas:
        if f.get("enabled", "yes").strip().lower() in ("no", "false", "0"):
            continue
        options = {k: v for k, v in f.items() if k not in ("types", "uris", "suites", "components")}
        out.append(Source(f.get("types", "").split(), f.get("uris", "").split(), f.get("suites", "").split(),
                          f.get("components", "").split(), options, f"{origin}:{start}"))
    return out


def read_sources(sources_list: str | None, sources_parts: str | None) -> list[Source]:
    """Every entry of apt's configured files, in apt's order: the main list, then the parts directory's
    ``*.list`` and ``*.sources`` files sorted by name. Missing files are skipped."""
    files = []
    if sources_list and os.path.isfile(sources_list):
        files.append(sources_list)
    if sources_parts and os.path.isdir(sources_parts):
        parts = glob.glob(os.path.join(sources_parts, "*.list")) + glob.glob(os.path.join(sources_parts, "*.sources"))
        files.extend(sorted(parts, key=os.path.basename))
    out = []
    for path in files:
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
        except OSError:
            continue
        out.extend(parse_deb822(text, path) if path.endswith(".sources") else parse_one_line(text, path))
    return out


def is_debian_suite(suite: str) -> bool:
    """A suite of Debian's main archive: a release name or alias, optionally with -updates/-backports...
    (``-security`` suites live in the security archive and are not this)."""
    s = suite.strip("/").lower()
    return any(s.endswith(sfx) and s[: len(s) - len(sfx)] in DEBIAN_RELEASES for sfx in _MAIN_ARCHIVE_SUFFIXES)


def _usable_uri(uri: str) -> bool:
    return not uri.lower().startswith("cdrom:") and "debian-security" not in uri.lower()


def find_debian_archive(sources: list[Source]) -> tuple[str, str | None] | None:
    """(URI, signed-by keyring file or None) of the first enabled binary entry of Debian's main archive."""
    for s in sources:
        if "deb" not in s.types:
            continue
        if not any(is_debian_suite(x) for x in s.suites):
            continue
        for uri in s.uris:
            if _usable_uri(uri):
                signed_by = s.options.get("signed-by")
                if signed_by and ("\n" in signed_by or not signed_by.startswith("/")):
                    signed_by = None  # an embedded key or fingerprints: apt's default keyrings decide
                return uri.rstrip("/"), signed_by
    return None


def sources_line(uri: str, signed_by: str | None, suite: str, components: list[str]) -> str:
    opts = f" [signed-by={signed_by}]" if signed_by else ""
    return f"deb{opts} {uri} {suite} {' '.join(components)}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sources-list", default="/etc/apt/sources.list", help="apt's Dir::Etc::SourceList")
    p.add_argument("--sources-parts", default="/etc/apt/sources.list.d", help="apt's Dir::Etc::SourceParts")
    p.add_argument("--suite", default="trixie", help="the suite to write (default trixie)")
    p.add_argument("--component", action="append", help="component(s) to write (default main)")
    p.add_argument("--uri-only", action="store_true", help="print only the archive's URI")
    args = p.parse_args(argv)
    found = find_debian_archive(read_sources(args.sources_list, args.sources_parts))
    if found is None:
        print(f"no Debian archive (a 'deb' entry for a Debian suite) in {args.sources_list} or "
              f"{args.sources_parts}/*.list|*.sources", file=sys.stderr)
        return 1
    uri, signed_by = found
    print(uri if args.uri_only else sources_line(uri, signed_by, args.suite, args.component or ["main"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
