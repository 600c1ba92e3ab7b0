"""Optional dependencies: import one, or say which extra installs it.

The core package decodes with torch, transformers, numba and rapidfuzz only. The evaluation
harness needs ``datasets`` and ``matplotlib`` (``pip install "ngramspec[eval]"``); code that
uses them calls :func:`require` instead of importing them directly, so a missing package ends
in an error that names the command to run rather than a bare ``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import and return ``module`` (a dotted name such as ``"matplotlib.pyplot"``); raise
    ImportError naming ``pip install "ngramspec[<extra>]"`` when it is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = err.name or module
        if module != missing and not module.startswith(missing + "."):
            raise  # the module is there but one of *its* own imports is not: keep that error
        raise ImportError(
            f"{module!r} is not installed; it comes with the {extra!r} extra: "
            f'pip install "ngramspec[{extra}]"'
        ) from err
