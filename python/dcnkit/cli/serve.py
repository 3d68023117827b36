"""``dcnkit serve`` and ``dcnkit triton-repo``: defined by :mod:`dcnkit.server.cli` (which ``python -m dcnkit.server``
runs too) and registered here. The server is optional: when its module cannot load, the two commands stay
listed and say why they cannot run (exit code 2), and the rest of the CLI works."""
from __future__ import annotations

import importlib

from dcnkit.cli.shared import CliError

_COMMANDS = (("serve", "the inference server"), ("triton-repo", "the Triton model repository writer"))


def register(sub) -> None:
    """Adds ``serve`` and ``triton-repo`` to the CLI's subparsers (placeholders naming the problem if need be)."""
    try:
        server_cli = importlib.import_module("dcnkit.server.cli")
        server_cli.register_commands(sub)
        return
    except Exception as e:  # the server is optional: keep the rest of the CLI working
        reason = f"{type(e).__name__}: {e}"
    for name, what in _COMMANDS:
        if name in sub.choices:
            continue
        p = sub.add_parser(name, help=f"{what} (unavailable: dcnkit.server.cli could not be loaded)",
                           description=f"{what}: unavailable here ({reason}).")

        def unavailable(args, name=name, reason=reason):
            raise CliError(name, f"unavailable: dcnkit.server.cli could not be loaded ({reason})")

        p.set_defaults(func=unavailable)
