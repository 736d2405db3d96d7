"""Package attributes imported on first use, so that importing a package (to read its configuration)
does not import torch and the rest of its engine."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, where: dict[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` for ``package`` that imports ``name`` from submodule ``where[name]``."""

    def __getattr__(name: str) -> object:
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
