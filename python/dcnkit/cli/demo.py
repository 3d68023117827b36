"""``dcnkit demo``: train, export and check a small DCNv2 classifier end to end (:mod:`dcnkit.demo`)."""
from __future__ import annotations

from dcnkit import demo
from dcnkit.cli.shared import cli_error_from


def cmd_demo(args) -> int:
    try:
        demo.check_arguments(args)
    except ValueError as e:
        raise cli_error_from(e) from None
    return demo.main_from_args(args)


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
    p = sub.add_parser("demo", help="train, export and check a small DCNv2 classifier end to end",
                       description=demo.__doc__.strip().splitlines()[0])
    demo.add_arguments(p)
    p.set_defaults(func=cmd_demo)
