"""``dcnkit build`` lives in :mod:`dcnkit.cli.build`; this module keeps its old import path."""
from __future__ import annotations

import sys

from dcnkit.cli.build import add_arguments, register, run_build  # noqa: F401


def main(argv=None) -> int:  # pragma: no cover - `python -m dcnkit build` goes through dcnkit.cli
    from dcnkit.cli.parser import main as cli_main

    return cli_main(["build", *(sys.argv[1:] if argv is None else argv)])
