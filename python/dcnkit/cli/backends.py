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
        if name == "libdcnkit_trt.so" and path is not None:
            print(f"  {'':<26} serves {_tensorrt_served(path)}")
    return 0


def _tensorrt_served(path) -> str:
    """The TensorRT releases the plugin library serves, and whether the installed tensorrt module is one of them."""
    import dcnkit

    served = " and ".join(f"TensorRT {m}.x" for m in dcnkit.tensorrt_releases_served(path))
    installed = dcnkit._tensorrt_version()
    if installed is None:
        return served
    try:
        dcnkit.tensorrt_library(installed)
    except ValueError:
        return f"{served}: not the installed TensorRT {installed}"
    return f"{served}, the installed TensorRT {installed} included"


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
    p = sub.add_parser("backends", help="list the backends and why any is unavailable, and the native libraries",
                       description="List the backends and why any is unavailable, then the native libraries "
                                   "this installation holds.")
    p.set_defaults(func=cmd_backends)
