"""``dcnkit backends``: every backend and, for those that cannot run here, why."""
from __future__ import annotations


def cmd_backends(args) -> int:
    from dcnkit.runtime.registry import available_backends

    for name, reason in available_backends().items():
        print(f"{name:<10} {'available' if reason is None else 'unavailable: ' + reason}")
    return 0


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
    p = sub.add_parser("backends", help="list the backends and why any is unavailable",
                       description="List the backends and why any is unavailable.")
    p.set_defaults(func=cmd_backends)
