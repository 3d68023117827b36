"""``dcnkit backends``: every backend and, for those that cannot run here, why; then the native libraries this
installation holds (what a wheel was built with)."""
from __future__ import annotations


def cmd_backends(args) -> int:
    from dcnkit._lib import native_libraries
    from dcnkit.runtime.registry import available_backends

    for name, reason in available_backends().items():
        print(f"{name:<10} {'available' if reason is None else 'unavailable: ' + reason}")
    print("\nnative libraries:")
    for name, path in native_libraries().items():
        print(f"  {name:<26} {path if path is not None else 'not in this build'}")
    return 0


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
    p = sub.add_parser("backends", help="list the backends and why any is unavailable, and the native libraries",
                       description="List the backends and why any is unavailable, then the native libraries "
                                   "this installation holds.")
    p.set_defaults(func=cmd_backends)
