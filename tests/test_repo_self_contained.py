"""The repository stands alone: no tracked file points outside it, and every relative Markdown link in a
tracked .md file resolves to a file of the repository (and, with a #fragment into a .md file, to one of its
headings)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Written in pieces so that this file does not match itself.
_OUTSIDE = [
    ("a sibling folder of the checkout", re.compile(re.escape("../" + "shared"))),
    ("the workspace", re.compile(r"(?<![\w.])/" + "work/")),
    ("the workspace's operator notes", re.compile(r"\b" + "OPS" + r"\.md\b")),
    ("the workspace's design notes", re.compile(r"\b" + "DESIGN" + r"\.md\b")),
    ("the workspace's build recipes", re.compile(r"\b" + "RECIPES" + r"\.md\b")),
]
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'][^\"']*[\"'])?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as e:  # pragma: no cover - not a git checkout
        pytest.skip(f"not a git checkout ({e})")
    return [p for p in out.stdout.decode().split("\0") if p and (ROOT / p).is_file()]


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode("utf-8", errors="replace")


def outside_references(text: str) -> list[tuple[int, str, str]]:
    """(line, what, excerpt) for every reference to a place outside the repository."""
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        for what, rx in _OUTSIDE:
            if rx.search(line):
                hits.append((n, what, line.strip()[:120]))
    return hits


def _strip_code(md: str) -> str:
    """Markdown without fenced code blocks and inline code spans (links there are not links)."""
    out, fence = [], None
    for line in md.splitlines():
        m = re.match(r"^\s{0,3}(`{3,}|~{3,})", line)
        if m:
            if fence is None:
                fence = m.group(1)[0] * len(m.group(1))
            elif m.group(1).startswith(fence):
                fence = None
            out.append("")
            continue
        out.append("" if fence else re.sub(r"`+[^`]*`+", "", line))
    return "\n".join(out)


def markdown_links(md: str) -> list[str]:
    """Targets of inline links, images and reference definitions, outside code."""
    body = _strip_code(md)
    return [m.group(1) for m in _LINK.finditer(body)] + [m.group(1) for m in _REF_DEF.finditer(body)]


def heading_slugs(md: str) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped, spaces -> '-')."""
    slugs, seen = set(), {}
    for line in _strip_code(md).splitlines():
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
        k = seen.get(s, 0)
        seen[s] = k + 1
        slugs.add(s if k == 0 else f"{s}-{k}")
    return slugs


def broken_links(md_path: Path, root: Path) -> list[str]:
    """Relative links of ``md_path`` that do not resolve to a file (or a heading) inside ``root``."""
    md = md_path.read_text(encoding="utf-8")
    bad = []
    for target in markdown_links(md):
        if _SCHEME.match(target) or target.startswith("//"):
            continue  # http:, https:, mailto: ... : not a file of the repository
        path, _, fragment = target.partition("#")
        dest = md_path if not path else (md_path.parent / path)
        try:
            resolved = dest.resolve()
            resolved.relative_to(root.resolve())
        except ValueError:
            bad.append(f"{target} (outside the repository)")
            continue
        if not resolved.exists():
            bad.append(f"{target} (no such file)")
            continue
        if fragment and resolved.suffix == ".md" and resolved.is_file():
            if fragment.lower() not in heading_slugs(resolved.read_text(encoding="utf-8")):
                bad.append(f"{target} (no heading #{fragment})")
    return bad


# ---- the checks themselves, on made-up files (they must be able to fail) ----------------------------


def test_outside_reference_scan_finds_each_kind():
    text = "\n".join([
        "see [ops](../" + "shared/" + "OP" + "S.md)",
        "path = '/" + "work/main/x'",
        "the " + "DESIGN" + ".md principles",
        "fine: docs/operators.md, ./build/work/ and https://example.org/work/",
    ])
    hits = outside_references(text)
    assert [h[0] for h in hits].count(1) == 2  # the sibling folder and the notes' name, same line
    assert {h[0] for h in hits} == {1, 2, 3}


def test_link_check_finds_missing_files_anchors_and_escapes(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.md").write_text("# Title\n\n## Bounded work\n")
    (root / "README.md").write_text(
        "[ok](docs/a.md) [anchor](docs/a.md#bounded-work) [self](#top-level) [web](https://x.org/y)\n"
        "[missing](docs/b.md) [bad anchor](docs/a.md#nowhere) [escape](../outside.md)\n"
        "```\n[in code](nowhere.md)\n```\n`[inline](nowhere2.md)`\n"
        "[ref]: docs/c.md\n"
        "# Top level\n")
    (tmp_path / "outside.md").write_text("x")
    bad = broken_links(root / "README.md", root)
    assert sorted(bad) == sorted([
        "docs/b.md (no such file)",
        "docs/a.md#nowhere (no heading #nowhere)",
        "../outside.md (outside the repository)",
        "docs/c.md (no such file)",
    ])


# ---- the repository ------------------------------------------------------------------------------------


def test_no_tracked_file_points_outside_the_repository():
    problems = []
    for rel in tracked_files():
        text = _text(ROOT / rel)
        if text is None:
            continue
        for n, what, excerpt in outside_references(text):
            problems.append(f"{rel}:{n}: {what}: {excerpt}")
    assert not problems, "references outside the repository:\n" + "\n".join(problems)


def test_every_relative_markdown_link_resolves():
    mds = [rel for rel in tracked_files() if rel.endswith(".md")]
    assert "README.md" in mds and "docs/operators.md" in mds and "docs/design.md" in mds
    problems = [f"{rel}: {b}" for rel in mds for b in broken_links(ROOT / rel, ROOT)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_readme_links_the_projects_own_docs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    links = {t.partition("#")[0] for t in markdown_links(readme)}
    assert {"docs/operators.md", "docs/design.md"} <= links
