"""The ``dcnkit`` command line's parser and dispatch: one subcommand per module of :mod:`dcnkit.cli`, each adding
itself with ``register(subparsers)``; :func:`main` runs the chosen command and turns its errors into one line.

Every command has ``--help``. Errors in arguments print one line naming the argument and exit with code 2;
a backend that cannot run here, or a failure while running, prints one line and exits with code 1
(``DCNKIT_DEBUG=1`` shows the traceback); ``compare`` exits with 1 when backends disagree.
"""
from __future__ import annotations

import argparse
import os
import sys

from dcnkit.cli import backends, bench, build, compare, convert, demo, export, fuse_msda, quantize, run, serve
from dcnkit.cli.shared import CliError

PROG = "dcnkit"

# In the order of `dcnkit --help`.
COMMAND_MODULES = (export, run, compare, bench, backends, demo, build, quantize, serve, convert, fuse_msda)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="dcnkit: deformable convolution and RoI pooling that ship.")
    from dcnkit import __version__

    parser.add_argument("--version", action="version", version=f"dcnkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"{PROG} {args.command}"
    from dcnkit.runtime.base import BackendUnavailable

    try:
        rc = args.func(args)
    except BackendUnavailable as e:  # the backend cannot run on this machine: what is missing, one line
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except CliError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    except Exception as e:  # a failure while running: one line, the traceback on request
        if os.environ.get("DCNKIT_DEBUG"):
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"{prog}: error: {type(e).__name__}: {first} (DCNKIT_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    return int(rc or 0)
