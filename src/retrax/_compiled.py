"""Public functions compiled as a whole, so that an eager call costs its
jitted time plus one dispatch."""

import functools
import inspect
import logging
from collections.abc import Callable

import jax
import numpy as np
from jax.errors import JaxRuntimeError

from ._errors import InvalidArgumentError, check_message
from ._float_dtypes import INEXACT


_CALLBACK_LOG = logging.getLogger("jax._src.callback")


class _QuietCallbackLog(logging.Filter):
    """Drops JAX's log of the failed check's callback, whose traceback
    would print before the error that reports it (as `eqx.filter_jit` does)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "jax.pure_callback failed"


_HOST = bool | int | float | complex | np.ndarray | np.generic


def _as_argument(value):
    """`value` as `jax.jit` should take it: a list or tuple of host numbers
    as one array (one traced argument, not one per number). Anything else,
    traced values among them, is passed as it is."""
    if isinstance(value, list | tuple):
        if all(isinstance(leaf, _HOST) for leaf in jax.tree.leaves(value)):
            try:
                return np.asarray(value)
            except ValueError:  # ragged: the function reports it
                return value
    return value


def _jax_type(leaf) -> bool:
    """Whether `jax.jit` takes `leaf` as the function itself would: not an
    object or extended-precision array, nor an integer array that JAX's
    precision would narrow (`int64` without x64), which the function
    converts or refuses itself. Floating arrays narrow (float64 to float32
    without x64) in `jax.jit` as in `jnp.asarray`."""
    # (NumPy arrays first: what eager calls mostly pass, and the cheapest test)
    if type(leaf) is np.ndarray and leaf.dtype in INEXACT:
        return True
    if isinstance(leaf, jax.Array | bool | int | float | complex):
        return True
    if isinstance(leaf, np.ndarray | np.generic):
        try:
            canonical = jax.dtypes.canonicalize_dtype(leaf.dtype)
        except TypeError:
            return False
        if np.issubdtype(leaf.dtype, np.inexact):
            return np.dtype(leaf.dtype).itemsize <= 16 and leaf.dtype != np.float16
        return canonical == leaf.dtype
    return False


def compiled(
    *, static: tuple[str, ...] = (), donate: tuple[str, ...] = ()
) -> Callable[[Callable], Callable]:
    """Compile the decorated function with `jax.jit` as a whole, its keyword
    arguments named in `static` static, every other argument traced; the
    arguments named in `donate` are donated (pass only arrays the caller
    made for the call).

    Calls whose arrays JAX cannot hold as they are (object or extended
    precision arrays, Python lists) run the function itself, which converts
    or refuses them with its own errors. A run-time check that fails during
    an eager call raises `InvalidArgumentError` (a `ValueError`) with the
    check's message; inside a user's `jax.jit` the check raises at run time
    as any other."""

    def decorate(fn: Callable) -> Callable:
        return _CompiledCall(fn, static, donate)

    return decorate


class _CompiledCall:
    """A function compiled as a whole by `compiled`: called like it, with
    `lower` (the jitted function's) as a method. A method, not an attribute:
    `jax.vmap` and `jax.jit` copy a wrapped function's attributes onto their
    wrapper, so an attribute `lower` would make `jax.jit(jax.vmap(f)).lower`
    lower the unbatched `f`."""

    def __init__(self, fn: Callable, static: tuple[str, ...], donate=()):
        functools.update_wrapper(self, fn)
        names = list(inspect.signature(fn).parameters)
        self._fn = fn
        self._static = frozenset(static)
        # the positions of the static arguments, when they are passed by position
        self._static_at = frozenset(i for i, name in enumerate(names) if name in static)
        self._jitted = jax.jit(fn, static_argnames=static, donate_argnames=donate)

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        static, static_at = self._static, self._static_at
        args = tuple(
            v if i in static_at else _as_argument(v) for i, v in enumerate(args)
        )
        kwargs = {k: v if k in static else _as_argument(v) for k, v in kwargs.items()}
        dynamic = [v for i, v in enumerate(args) if i not in static_at]
        dynamic += [v for k, v in kwargs.items() if k not in static]
        if not all(_jax_type(leaf) for leaf in jax.tree.leaves(dynamic)):
            return self._fn(*args, **kwargs)
        quiet = _QuietCallbackLog()
        _CALLBACK_LOG.addFilter(quiet)
        try:
            # As `eqx.filter_jit` does: wait for the program, so that a
            # failed check raises here, not later (or never) from an
            # array dispatched asynchronously.
            return jax.block_until_ready(self._jitted(*args, **kwargs))
        # JAX raises a failed callback as `JaxRuntimeError` or, in some
        # releases, `ValueError` (equinox's `filter_jit` catches both)
        except (JaxRuntimeError, ValueError) as error:
            msg = check_message(str(error))
            if msg is None:
                raise
            raise InvalidArgumentError(msg) from None
        finally:
            _CALLBACK_LOG.removeFilter(quiet)

    def lower(self, *args, **kwargs):
        """The jitted function's `lower` (ahead-of-time compilation)."""
        return self._jitted.lower(*args, **kwargs)

    def _cache_size(self) -> int:
        return self._jitted._cache_size()
