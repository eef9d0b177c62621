"""Warnings that point at the user's line: deprecations, and the library's
other warnings (`warn_at_caller`)."""

import functools
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jaxtyping


# retrax's own files, equinox's (whose module machinery calls `__init__` and
# properties through several frames of its own) and jaxtyping's (whose
# type-checking wrappers may stand around retrax's functions)
_INTERNAL = tuple(
    os.path.dirname(os.path.abspath(module.__file__)) + os.sep
    for module in (sys.modules[__package__], eqx, jaxtyping)
)


def warn_at_caller(message: str, category: type[Warning]) -> None:
    """Warn with `category`, attributed to the first frame outside retrax,
    equinox and jaxtyping: the user's line, which Python's default filters
    show and which a test's `pytest.warns` records."""
    frame, level = sys._getframe(1), 2
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def warn_deprecated(message: str) -> None:
    """Warn with `DeprecationWarning` at the code that used the old spelling."""
    warn_at_caller(message, DeprecationWarning)


def deprecated_property(old: str, new: str, read: Callable[[Any], Any]) -> property:
    """A read-only property for the renamed field `old` (e.g. `"Sample.x"`):
    it warns with a `DeprecationWarning` naming `new` (e.g. `".value"`), and
    returns `read(self)`, the field's new place."""

    def get(self):
        warn_deprecated(f"`{old}` is deprecated: use `{new}`.")
        return read(self)

    get.__doc__ = f"Deprecated: `{new}`."
    return property(get)


class _RenamedArgument:
    """`f` with its argument `old` renamed `new` (see `renamed_argument`);
    `lower` is forwarded, as a method, when `f` has one (a jitted solve)."""

    def __init__(self, f: Callable, old: str, new: str):
        functools.update_wrapper(self, f)
        self._f, self._old, self._new = f, old, new

    def _renamed(self, kwargs: dict) -> dict:
        old, new = self._old, self._new
        if old in kwargs:
            name = getattr(self._f, "__name__", "the function")
            if new in kwargs:
                raise TypeError(
                    f"`{name}` got both `{old}` and `{new}`; `{old}` is the old "
                    f"name of `{new}`."
                )
            warn_deprecated(
                f"`{name}(..., {old}=...)` is deprecated: the argument is `{new}`."
            )
            kwargs[new] = kwargs.pop(old)
        return kwargs

    def __call__(self, *args, **kwargs):
        return self._f(*args, **self._renamed(kwargs))

    def lower(self, *args, **kwargs):
        """The wrapped function's `lower` (ahead-of-time compilation)."""
        return self._f.lower(*args, **self._renamed(kwargs))


def renamed_argument(old: str, new: str) -> Callable[[Callable], Callable]:
    """A decorator for a function whose argument `old` is now `new`: a call
    that passes `old=` by keyword warns with a `DeprecationWarning` and is
    passed on as `new=`. Positional calls are unaffected; the signature
    shown (`inspect.signature`) is the function's own."""
    return lambda f: _RenamedArgument(f, old, new)
