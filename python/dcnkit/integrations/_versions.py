"""The release check every integration makes before it changes anything: a package's version in a known range."""
from __future__ import annotations

import importlib
import re


def version_tuple(text: str) -> tuple[int, ...]:
    """(5, 24, 0) from "5.24.0" (also "5.25.0.dev0", "5.24.0+local": the leading release numbers)."""
    match = re.match(r"\d+(\.\d+)*", text.strip())
    return tuple(int(p) for p in match.group(0).split(".")) if match else ()


def check_version(package: str, supported: tuple[str, str], version: str | None = None) -> str:
    """``package``'s version (or ``version``), or ``RuntimeError`` unless it is ``>= supported[0], < supported[1]``
    (ImportError, with the extra to install, when the package is missing)."""
    where = f"dcnkit.integrations.{package}"
    if version is None:
        try:
            version = importlib.import_module(package).__version__
        except ImportError as e:
            raise ImportError(f"{where}: needs {package} >={supported[0]},<{supported[1]} (pip install "
                              f"'dcnkit[{package}]')") from e
    v = version_tuple(version)
    if not version_tuple(supported[0]) <= v < version_tuple(supported[1]):
        raise RuntimeError(f"{where}: {package} {version} is not supported: expected >={supported[0]},<{supported[1]} "
                           "(its deformable-attention code may differ; the patch is refused rather than risk "
                           "computing something else)")
    return version
