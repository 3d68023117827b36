"""scripts/setup.sh's ONNX Runtime headers: the Debian archive comes from the machine's own apt sources (both
formats; scripts/apt_debian_url.py), only ``trixie main`` is added, DCNKIT_ORT_INCLUDE_DIR means nothing is
fetched, and a machine without apt-get gets one line saying what to provide (scripts/ort_headers.sh).
No network: apt-get is replaced by a stand-in that records what it was asked and builds a small .deb."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
HEADER = "onnxruntime_cxx_api.h"


def _load_parser():
    spec = importlib.util.spec_from_file_location("apt_debian_url", SCRIPTS / "apt_debian_url.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


apt_url = _load_parser()

# A machine like a Debian bookworm container with extra vendor repositories (one-line and deb822 files).
ONE_LINE = textwrap.dedent("""\
    # deb http://commented.example/debian bookworm main
    deb-src http://src-only.example/debian bookworm main
    deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main
    deb [arch=amd64 signed-by=/usr/share/keyrings/corp.gpg] http://mirror.corp.example/debian/ bookworm main contrib # our mirror
    deb http://security.debian.org/debian-security bookworm-security main
""")
DEB822 = textwrap.dedent("""\
    Types: deb
    # http://snapshot.debian.org/archive/debian/20250520T000000Z
    URIs: http://deb.debian.org/debian
    Suites: bookworm bookworm-updates
    Components: main
    Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

    Types: deb
    URIs: http://deb.debian.org/debian-security
    Suites: bookworm-security
    Components: main
""")


def _parse(text: str, fmt: str):
    return apt_url.parse_deb822(text, "f") if fmt == "deb822" else apt_url.parse_one_line(text, "f")


def _archive(text: str, fmt: str):
    return apt_url.find_debian_archive(_parse(text, fmt))


# ---- parsing --------------------------------------------------------------------------------------------


def test_one_line_format_comments_options_and_deb_src():
    entries = apt_url.parse_one_line(ONE_LINE, "sources.list")
    assert [(e.types, e.uris, e.suites) for e in entries] == [
        (["deb-src"], ["http://src-only.example/debian"], ["bookworm"]),
        (["deb"], ["https://packages.cloud.google.com/apt"], ["cloud-sdk-bookworm"]),
        (["deb"], ["http://mirror.corp.example/debian/"], ["bookworm"]),
        (["deb"], ["http://security.debian.org/debian-security"], ["bookworm-security"]),
    ]
    corp = entries[2]
    assert corp.components == ["main", "contrib"]  # the trailing comment is not a component
    assert corp.options == {"arch": "amd64", "signed-by": "/usr/share/keyrings/corp.gpg"}
    # The commented entry and the deb-src entry are not chosen; the vendor suite is not Debian's.
    assert _archive(ONE_LINE, "one-line") == ("http://mirror.corp.example/debian", "/usr/share/keyrings/corp.gpg")


def test_options_with_spaces_inside_the_brackets():
    text = "deb [ arch=amd64,arm64   trusted=yes ] http://m.example/debian trixie main\n"
    (e,) = apt_url.parse_one_line(text)
    assert e.uris == ["http://m.example/debian"] and e.suites == ["trixie"]
    assert e.options == {"arch": "amd64,arm64", "trusted": "yes"}


def test_deb822_comments_continuations_and_stanzas():
    entries = apt_url.parse_deb822(DEB822, "debian.sources")
    assert [(e.types, e.uris, e.suites) for e in entries] == [
        (["deb"], ["http://deb.debian.org/debian"], ["bookworm", "bookworm-updates"]),
        (["deb"], ["http://deb.debian.org/debian-security"], ["bookworm-security"]),
    ]
    assert _archive(DEB822, "deb822") == ("http://deb.debian.org/debian",
                                          "/usr/share/keyrings/debian-archive-keyring.gpg")


def test_security_archive_alone_is_not_picked():
    sec_only = "deb http://security.debian.org/debian-security bookworm-security main\n"
    assert _archive(sec_only, "one-line") is None
    # Even under an unusual URI, a -security suite is not the main archive.
    assert _archive("deb http://mirror.example/sec trixie-security main\n", "one-line") is None


def test_deb822_multiple_uris_types_and_disabled_stanzas():
    text = textwrap.dedent("""\
        Types: deb-src
        URIs: http://src.example/debian
        Suites: trixie
        Components: main

        Enabled: no
        Types: deb
        URIs: http://disabled.example/debian
        Suites: trixie
        Components: main

        types: deb deb-src
        uris: cdrom:/media/cdrom/ http://first.example/debian/ http://second.example/debian
        suites: stable
        components: main
        signed-by:
         -----BEGIN PGP PUBLIC KEY BLOCK-----
         .
         mQINBGPL0BUBEADmW5NlOfO4Jk
         -----END PGP PUBLIC KEY BLOCK-----
    """)
    entries = apt_url.parse_deb822(text)
    assert len(entries) == 2  # the disabled stanza is dropped
    assert entries[1].types == ["deb", "deb-src"]  # field names are case-insensitive
    assert entries[1].uris == ["cdrom:/media/cdrom/", "http://first.example/debian/", "http://second.example/debian"]
    # First usable URI (not the CD); an embedded key is not a keyring file: apt's defaults apply.
    assert apt_url.find_debian_archive(entries) == ("http://first.example/debian", None)


@pytest.mark.parametrize("suite, expected", [
    ("bookworm", True), ("trixie", True), ("bookworm-updates", True), ("bookworm-backports", True),
    ("stable", True), ("sid", True), ("unstable", True), ("trixie/", True),
    ("bookworm-security", False), ("cloud-sdk-bookworm", False), ("nodistro", False), ("jammy", False),
    ("noble-updates", False), ("stable-security", False),
])
def test_debian_suites(suite, expected):
    assert apt_url.is_debian_suite(suite) is expected


def test_files_read_in_apt_order_and_first_archive_wins(tmp_path):
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    (parts / "b-debian.sources").write_text(DEB822)
    (parts / "a-vendor.list").write_text("deb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n")
    (parts / "c-other.list").write_text("deb http://later.example/debian trixie main\n")
    (parts / "z.list.disabled").write_text("deb http://ignored.example/debian trixie main\n")
    main = tmp_path / "sources.list"
    main.write_text("# empty but for a comment\n")
    entries = apt_url.read_sources(str(main), str(parts))
    assert [e.origin.split(":")[0].rsplit("/", 1)[-1] for e in entries] == [
        "a-vendor.list", "b-debian.sources", "b-debian.sources", "c-other.list"]
    assert apt_url.find_debian_archive(entries)[0] == "http://deb.debian.org/debian"
    # sources.list is read first.
    main.write_text("deb http://first.example/debian bookworm main\n")
    assert apt_url.find_debian_archive(apt_url.read_sources(str(main), str(parts)))[0] == "http://first.example/debian"


def test_command_line_prints_one_trixie_main_line(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "debian.sources").write_text(DEB822)
    out = subprocess.run([sys.executable, str(SCRIPTS / "apt_debian_url.py"), "--sources-list",
                          str(tmp_path / "none.list"), "--sources-parts", str(parts)],
                         check=True, capture_output=True, text=True, timeout=60)
    assert out.stdout == ("deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
                          "http://deb.debian.org/debian trixie main\n")
    (parts / "debian.sources").write_text("Types: deb\nURIs: http://archive.ubuntu.com/ubuntu\nSuites: noble\n")
    bad = subprocess.run([sys.executable, str(SCRIPTS / "apt_debian_url.py"), "--sources-list",
                          str(tmp_path / "none.list"), "--sources-parts", str(parts)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stdout == "" and len(bad.stderr.strip().splitlines()) == 1


# ---- scripts/ort_headers.sh ---------------------------------------------------------------------------


def _tool_dir(tmp_path: Path, with_apt: bool) -> Path:
    """A PATH with only what the script needs: bash, coreutils it calls, python3, dpkg-deb; and a
    stand-in apt-get that logs its calls and the sources list it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "mkdir", "rm", "cp", "cat", "printf", "ls", "dpkg-deb", "tar", "env"):
        src = shutil.which(tool)
        if src:
            os.symlink(src, bin_dir / tool)
    os.symlink(sys.executable, bin_dir / "python3")
    if with_apt:
        (bin_dir / "apt-get").write_text(textwrap.dedent(f"""\
            #!{shutil.which("bash")}
            log="{tmp_path}/apt.log"
            echo "apt-get $*" >> "$log"
            for a in "$@"; do
              case "$a" in Dir::Etc::SourceList=*) cp "${{a#*=}}" "{tmp_path}/sources.seen" ;; esac
            done
            case " $* " in
              *" download libonnxruntime-dev"*)
                pkg="{tmp_path}/pkg"; mkdir -p "$pkg/DEBIAN" "$pkg/usr/include/onnxruntime/core"
                printf 'Package: libonnxruntime-dev\\nVersion: 1.0\\nArchitecture: all\\nMaintainer: t <t@t>\\nDescription: t\\n' > "$pkg/DEBIAN/control"
                echo '// fake' > "$pkg/usr/include/onnxruntime/{HEADER}"
                echo '// fake' > "$pkg/usr/include/onnxruntime/core/x.h"
                dpkg-deb --build "$pkg" "$PWD/libonnxruntime-dev_1.0_all.deb" >/dev/null ;;
            esac
        """))
        (bin_dir / "apt-get").chmod(0o755)
    return bin_dir


def _run_headers(tmp_path, bin_dir, env_extra=None):
    env = {"PATH": str(bin_dir), "HOME": str(tmp_path), **(env_extra or {})}
    return subprocess.run([str(bin_dir / "bash"), str(SCRIPTS / "ort_headers.sh"), str(tmp_path / "deps")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_include_dir_from_the_environment_fetches_nothing(tmp_path):
    inc = tmp_path / "ort" / "include"
    inc.mkdir(parents=True)
    (inc / HEADER).write_text("// given\n")
    bin_dir = _tool_dir(tmp_path, with_apt=True)
    r = _run_headers(tmp_path, bin_dir, {"DCNKIT_ORT_INCLUDE_DIR": str(inc)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(inc.resolve())
    assert not (tmp_path / "apt.log").exists()  # apt-get never called
    assert not (tmp_path / "deps").exists()


def test_include_dir_without_the_header_is_one_line_error(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    r = _run_headers(tmp_path, _tool_dir(tmp_path, with_apt=True), {"DCNKIT_ORT_INCLUDE_DIR": str(empty)})
    assert r.returncode != 0 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "DCNKIT_ORT_INCLUDE_DIR" in lines[0] and HEADER in lines[0]
    assert not (tmp_path / "apt.log").exists()


def test_no_apt_get_says_what_to_provide_in_one_line(tmp_path):
    r = _run_headers(tmp_path, _tool_dir(tmp_path, with_apt=False))
    assert r.returncode != 0 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "apt-get" in lines[0] and "DCNKIT_ORT_INCLUDE_DIR" in lines[0] and HEADER in lines[0]


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="dpkg-deb is needed to build the stand-in package")
def test_fetch_uses_the_machines_archive_and_only_trixie_main(tmp_path):
    etc = tmp_path / "etc"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text(ONE_LINE)
    (etc / "sources.list.d" / "debian.sources").write_text(DEB822)
    bin_dir = _tool_dir(tmp_path, with_apt=True)
    env = {"DCNKIT_APT_SOURCES_LIST": str(etc / "sources.list"),
           "DCNKIT_APT_SOURCES_PARTS": str(etc / "sources.list.d")}
    r = _run_headers(tmp_path, bin_dir, env)
    assert r.returncode == 0, r.stderr
    inc = tmp_path / "deps" / "onnxruntime" / "include"
    assert r.stdout.strip() == str(inc.resolve())
    assert (inc / HEADER).read_text() == "// fake\n" and (inc / "core" / "x.h").is_file()
    # The temporary list: the machine's own mirror (the first Debian archive of its sources), trixie main only.
    assert (tmp_path / "sources.seen").read_text() == (
        "deb [signed-by=/usr/share/keyrings/corp.gpg] http://mirror.corp.example/debian trixie main\n")
    calls = (tmp_path / "apt.log").read_text().splitlines()
    assert [c.split()[-1] for c in calls] == ["update", "libonnxruntime-dev"]
    assert all("Dir::Etc::SourceParts=/dev/null" in c for c in calls)  # the machine's other sources are not used
    # A second run finds the headers and calls nothing.
    r2 = _run_headers(tmp_path, bin_dir, env)
    assert r2.returncode == 0 and r2.stdout.strip() == str(inc.resolve())
    assert len((tmp_path / "apt.log").read_text().splitlines()) == 2


def test_no_debian_archive_in_apt_sources_is_one_line_error(tmp_path):
    etc = tmp_path / "etc"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "sources.list").write_text("deb http://archive.ubuntu.com/ubuntu noble main universe\n")
    r = _run_headers(tmp_path, _tool_dir(tmp_path, with_apt=True),
                     {"DCNKIT_APT_SOURCES_LIST": str(etc / "sources.list"),
                      "DCNKIT_APT_SOURCES_PARTS": str(etc / "sources.list.d")})
    assert r.returncode != 0 and r.stdout == ""
    assert "DCNKIT_ORT_INCLUDE_DIR" in r.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "apt.log").exists()


def test_setup_sh_takes_the_headers_from_ort_headers_sh():
    """setup.sh has no archive address of its own and builds with the directory ort_headers.sh printed."""
    text = (SCRIPTS / "setup.sh").read_text()
    assert "http://" not in text and "https://" not in text
    assert 'ort_inc="$(bash "$root/scripts/ort_headers.sh"' in text
    assert 'export DCNKIT_ORT_INCLUDE_DIR="$ort_inc"' in text
