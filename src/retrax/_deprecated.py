"""Warnings that point at the user's line: deprecations, and the library's
other warnings (`warn_at_caller`); and the guards of changed signatures
(`renamed_argument`, `signal_first`)."""

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


def _listed(names: tuple[str, ...]) -> str:
    """The names quoted and listed: `b`, `b` and `a`, `A`, `B` and `C`."""
    quoted = [f"`{n}`" for n in names]
    if len(quoted) == 1:
        return quoted[0]
    return ", ".join(quoted[:-1]) + " and " + quoted[-1]


class _SignalFirst:
    """`f` that takes its signal first and `coefficients` by keyword, and
    refuses a call in its old order (see `signal_first`); `lower` is
    forwarded, as a method, when `f` has one (a compiled op)."""

    def __init__(self, f: Callable, coefficients: tuple[str, ...], signal: str):
        functools.update_wrapper(self, f)
        self._signal_first = (f, coefficients, signal)

    def _check(self, args: tuple, kwargs: dict) -> None:
        f, coefficients, signal = self._signal_first
        if len(args) <= 1 and not (args and signal in kwargs):
            return
        name = getattr(f, "__name__", "the function")
        # the old order was the coefficients, the signal, then `zi`
        zi = ("zi",) if len(args) > len(coefficients) + 1 else ()
        by_keyword = coefficients + zi
        new = ", ".join((signal, *(f"{n}={n}" for n in by_keyword)))
        old = ", ".join((*coefficients, signal, *zi))
        listed = _listed(by_keyword)
        verb = "is" if len(by_keyword) == 1 else "are"
        raise TypeError(
            f"`{name}` takes the signal `{signal}` first and {listed} by keyword: "
            f"`{name}({new})` (it was `{name}({old})`). For this release {listed} "
            f"{verb} keyword-only, so that a call "
            "in the old order fails instead of returning plausible wrong numbers "
            "from swapped arrays."
        )

    def __call__(self, *args, **kwargs):
        self._check(args, kwargs)
        return self._signal_first[0](*args, **kwargs)

    def lower(self, *args, **kwargs):
        """The wrapped function's `lower` (ahead-of-time compilation)."""
        self._check(args, kwargs)
        return self._signal_first[0].lower(*args, **kwargs)


def signal_first(
    *coefficients: str, signal: str = "x"
) -> Callable[[Callable], Callable]:
    """A decorator for an op that used to take `coefficients` before the
    signal (`fir(b, x)`) and now takes the signal first, its coefficients
    keyword-only (`fir(x, *, b)`): a call with more than one positional
    argument, or one positional argument and the signal by keyword, raises a
    `TypeError` that names the new spelling, eagerly and while tracing.
    Calls by keyword in any order are unaffected; the signature shown
    (`inspect.signature`) is the function's own."""
    return lambda f: _SignalFirst(f, coefficients, signal)
