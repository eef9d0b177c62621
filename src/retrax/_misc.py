"""Small private helpers shared across retrax."""

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike

from ._errors import error_if
from ._float_dtypes import INEXACT


def result_dtype(*args: ArrayLike | None) -> np.dtype:
    """The dtype that `args` promote to under JAX's standard rules.

    Python scalars are weakly typed, so `float32` signals with Python-float
    coefficients stay `float32`. This is computed with standard promotion even
    when the caller runs under strict promotion, because mixing is the library's
    decision to make explicit here.
    """
    present = [a for a in args if a is not None]
    with jax.numpy_dtype_promotion("standard"):
        return jnp.result_type(*present)


def as_inexact(name: str, value: ArrayLike) -> jax.Array:
    """Convert `value` to an inexact (floating or complex) array.

    Integer and boolean values are accepted as JAX accepts them in arithmetic:
    they become JAX's default float (float32, or float64 with x64 enabled),
    weakly typed, so that they promote like Python numbers and an integer
    coefficient leaves a float32 signal float32 (as `f32 + i32` is `f32` in
    JAX). `name` is kept in the signature for the callers' messages.
    """
    del name
    # A JAX array that is already inexact is returned as it is: under an
    # eager `jax.grad` every primitive bound here, even a conversion to the
    # same dtype, costs a linearisation of its own (about 0.4 ms).
    if isinstance(value, jax.Array) and value.dtype in INEXACT:
        return value
    arr = jnp.asarray(value)
    if jnp.issubdtype(arr.dtype, jnp.inexact):
        return arr
    # Multiplying by a weak 1.0 is JAX's own integer-to-float promotion and
    # keeps the result weakly typed (`astype` would make it strong).
    with jax.numpy_dtype_promotion("standard"):
        return arr * 1.0


def cast(x: jax.Array, dtype) -> jax.Array:
    """`x.astype(dtype)`, but `x` itself when that would change nothing (the
    same dtype, strongly typed), so that no primitive is bound: under an
    eager `jax.grad` each one costs a linearisation of its own."""
    if x.dtype == dtype and not jax.typeof(x).weak_type:
        return x
    return x.astype(dtype)


def check_value(value: Any, bad: Callable[[ModuleType, Any], Any], msg: str) -> Any:
    """Raise `msg` where `bad(xp, value)` holds, eagerly and under `jit`.

    `bad` computes the failing entries with the array namespace `xp` it is
    given (`numpy` or `jax.numpy`). Python and NumPy values are checked at once
    with NumPy and raise a `ValueError`, so that a Python-float hyperparameter
    stays a Python float. JAX arrays go through `retrax._errors.error_if` with
    the same message: a concrete one raises `InvalidArgumentError` (a
    `ValueError`) at once, a traced one (`jit`, `vmap`, `grad`) at run time;
    that check is only kept if the returned value is used, so always store the
    result.
    """
    if isinstance(value, jax.Array):
        return error_if(value, jnp.any(bad(jnp, value)), msg)
    flag = bad(np, np.asarray(value))
    if isinstance(flag, jax.Array):  # `bad` involves a JAX value (e.g. a bound)
        return error_if(jnp.asarray(value), jnp.any(flag), msg)
    if np.any(flag):
        raise ValueError(msg)
    return value


def static_float(name: str, value: Any) -> float:
    """`value` as a Python float: a hyperparameter fixed when a program is traced.

    A traced value (an argument of a `jit`-, `vmap`- or `grad`-transformed
    function) raises a `TypeError` naming `name` instead of JAX's tracer
    error; close over the value or mark it static instead.
    """
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f"`{name}` is fixed when the program is traced: pass a Python float "
            f"(close over it, or mark it static in `jax.jit`), not a traced array."
        )
    return float(value)


def all_finite(tree: Any) -> jax.Array:
    """Whether every floating-point array of `tree` is finite, as a traced
    boolean (other leaves, integers and PRNG keys among them, are skipped)."""
    flags = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if isinstance(x, jax.Array | np.ndarray)
        and jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def check_positive_int(name: str, value: Any) -> None:
    """`value` must be a positive Python `int` (a size or a count of steps)."""
    if isinstance(value, bool) or not (
        isinstance(value, int | np.integer) and value >= 1
    ):
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")


def check_tol(tol: Any) -> float | None:
    """A solver's tolerance as a Python float: positive and finite, or `None`
    for the dtype's default; a `ValueError` naming `tol` otherwise (a traced
    one a `TypeError`, from `static_float`)."""
    if tol is None:
        return None
    value = static_float("tol", tol)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(
            f"`tol` must be a positive, finite tolerance (or None for the "
            f"dtype's default), got {tol!r}: no solve can meet it."
        )
    return value


def scipy_signal(what: str) -> ModuleType:
    """`scipy.signal`, imported when retrax first designs `what` with it (a
    filter, named as the user asked for it): scipy is an optional dependency,
    and importing it takes most of a second, so no module imports it at
    import time."""
    try:
        import scipy.signal
    except ImportError as e:
        raise ImportError(
            f"scipy.signal is needed to design {what}, and scipy is not "
            'installed: install it with `pip install "retrax[scipy]"` (or '
            "`pip install scipy`)."
        ) from e
    return scipy.signal
