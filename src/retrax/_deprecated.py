"""Deprecation warnings that point at the user's line."""

import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx


# retrax's own files, and equinox's (whose module machinery calls `__init__`
# and properties through several frames of its own)
_INTERNAL = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.dirname(os.path.abspath(eqx.__file__)) + os.sep,
)


def warn_deprecated(message: str) -> None:
    """Warn with `DeprecationWarning`, attributed to the first frame outside
    retrax and equinox, so that Python's default filters show it to the code
    that used the old spelling."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)


def deprecated_property(old: str, new: str, read: Callable[[Any], Any]) -> property:
    """A read-only property for the renamed field `old` (e.g. `"Sample.x"`):
    it warns with a `DeprecationWarning` naming `new` (e.g. `".value"`), and
    returns `read(self)`, the field's new place."""

    def get(self):
        warn_deprecated(f"`{old}` is deprecated: use `{new}`.")
        return read(self)

    get.__doc__ = f"Deprecated: `{new}`."
    return property(get)
