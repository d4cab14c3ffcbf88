"""Names that moved in the 0.2 renovation, still reachable where they were, with a warning."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def moved(module: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that finds each old name at its new ``"module:attr"`` home.

    The new home is imported only when the old name is used, so a module never imports
    a higher floor for its own sake.
    """

    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        new_module, _, attr = names[name].partition(":")
        warnings.warn(f"{module}.{name} moved to {new_module}.{attr}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new_module), attr)

    return __getattr__
