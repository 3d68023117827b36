"""The ``dcnkit`` command line: export, run, compare, bench, backends, demo, build (+ serve / triton-repo).

Every command has ``--help``. Errors in arguments print one line naming the argument and exit with code 2;
``compare`` exits with 1 when backends disagree.

One module per command (``export``, ``run``, ``compare``, ``bench``, ``backends``, ``demo``, ``build``, ``serve``
for serve and triton-repo), each adding itself to the parser of :mod:`dcnkit.cli.parser` (``main``, the
dispatch); ``feeds`` (input specifications, random inputs), ``tolerances`` and ``backend_args`` are what
several commands read; :mod:`dcnkit.cli.shared` (``CliError``, progress bars) is imported by every command
and imports none. The names below are importable from ``dcnkit.cli`` and load their module on first use, so
``import dcnkit.cli`` stays cheap.
"""
from __future__ import annotations

import importlib

_NAMES = {
    "main": "parser",
    "build_parser": "parser",
    "PROG": "parser",
    "CliError": "shared",
    "SPEC_HELP": "feeds",
    "InputSpec": "feeds",
    "parse_shape": "feeds",
    "parse_input_spec": "feeds",
    "random_rois": "feeds",
    "random_array": "feeds",
    "make_feeds": "feeds",
    "load_npz": "feeds",
    "parse_tolerances": "tolerances",
    "check_tolerance_names": "tolerances",
    "format_tolerances": "tolerances",
    "FAST_BACKENDS": "backend_args",
    "load_factory": "export",
    "cmd_export": "export",
    "cmd_run": "run",
    "choose_compare_backends": "compare",
    "format_stats": "compare",
    "cmd_compare": "compare",
    "bench_runner": "bench",
    "cmd_bench": "bench",
    "cmd_backends": "backends",
    "cmd_demo": "demo",
}


def __getattr__(name: str):
    if name in _NAMES:
        value = getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_NAMES))


__all__ = sorted(_NAMES)
