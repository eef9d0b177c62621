"""Private input checks shared by the ops, the effects, the filters and the
rest: the one home of retrax's generic argument checks (one helper per
check, its message naming the user's argument and saying what to do)."""

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jaxtyping import ArrayLike

from ._errors import InvalidArgumentError, _raising, error_if
from ._misc import as_inexact


def unsupported_dtype(dtype: np.dtype) -> str | None:
    """Why retrax does not compute in `dtype`, or `None` if it does."""
    if not (jnp.issubdtype(dtype, jnp.number) or jnp.issubdtype(dtype, jnp.bool_)):
        return (
            f"must be numeric, got dtype {dtype}; retrax computes in float32, "
            "float64, complex64 or complex128"
        )
    if dtype.kind in "fc" and dtype.itemsize > (8 if dtype.kind == "f" else 16):
        return (
            f"has dtype {dtype} (NumPy's long double), which JAX does not compute "
            "in; convert it to float64 or complex128"
        )
    return None


def check_dtype(name: str, value) -> None:
    """A `TypeError` naming `name` and the dtype of `value` (an array, or what
    NumPy makes of it) unless retrax computes in it.

    JAX has no extended precision (`float128`/`complex256`, NumPy's long
    double) and no object or string arrays; they would otherwise fail inside
    JAX with a message that names neither.
    """
    dtype = getattr(value, "dtype", None)
    if dtype is None and hasattr(value, "__jax_array__"):
        return  # JAX converts it
    if dtype is None:
        try:
            dtype = np.asarray(value).dtype
        except Exception:  # e.g. a list of tracers: JAX converts it
            return
    why = unsupported_dtype(np.dtype(dtype))
    if why is not None:
        raise TypeError(f"`{name}` {why}.")


def inexact(name: str, value: ArrayLike) -> Array:
    """`as_inexact(name, value)` after `check_dtype`: a dtype JAX does not
    compute in is a `TypeError` naming `name` and the dtype."""
    check_dtype(name, value)
    return as_inexact(name, value)


def check_signal(name: str, x: Array) -> None:
    """A single signal of shape `(time,)` (batch with `jax.vmap`)."""
    if x.ndim != 1:
        raise ValueError(
            f"`{name}` must be one signal of shape (time,), got shape {x.shape}. "
            "Batch several signals with `jax.vmap`."
        )


def check_finite(name: str, value: Array) -> Array:
    """Raise at run time (also under `jit`) if `value` has a `nan` or `inf`.

    A concrete `value` raises `ValueError` at once. The check is only kept by
    JAX if the returned array is used; a gradient that reads only the
    returned array's cotangent keeps it too (`in_gradient`, see
    `retrax._errors.error_if`). It also holds inside `shard_map`.
    """
    return error_if(
        value,
        ~jnp.all(jnp.isfinite(value)),
        f"`{name}` has non-finite (nan or inf) entries.",
        in_gradient=True,
    )


def check_finite_by_output(name: str, coeffs: Array, y: Array) -> Array:
    """`check_finite(name, coeffs)` for the per-sample coefficients of a
    sequential linear recursion with output `y` (time first); returns `y`.

    A non-finite coefficient makes the output non-finite from its sample to
    the end: NaN and inf never leave a linear recursion (`0 * inf` is NaN).
    So only when the last output is not finite (a bad coefficient, or a
    non-finite or overflowing signal, which pass through) are the
    coefficients scanned. The scan is a reduction, which costs about as much
    as the recursion itself on a CPU; the last output is one number.
    """
    if y.shape[0] == 0:
        return y
    suspect = eqx.internal.unvmap_any(~jnp.all(jnp.isfinite(y[-1])))

    def scan(c):
        return ~jnp.all(jnp.isfinite(c))

    def skip(c):
        # `False`, typed like `scan`'s result (varying over the same manual
        # mesh axes inside `shard_map`, which `lax.cond` requires)
        return jnp.isnan(c.ravel()[0].real) & False

    bad = lax.cond(suspect, scan, skip, coeffs)
    msg = f"`{name}` has non-finite (nan or inf) entries."
    return error_if(y, bad, msg, in_gradient=True)


def check_coeff_rank(name: str, c: Array, length: int, what: str) -> None:
    """Coefficients of shape `(n,)` (constant) or `(T, n)` (per sample)."""
    if c.ndim not in (1, 2):
        raise ValueError(
            f"`{name}` must have shape ({what},) or (time, {what}), got shape "
            f"{c.shape}."
        )
    if c.ndim == 2 and c.shape[0] != length:
        raise ValueError(
            f"time-varying `{name}` must have one row per sample of `x`: `{name}` "
            f"has {c.shape[0]} rows and `x` has {length} samples."
        )


def check_zi(
    zi: ArrayLike | None, shape: tuple[int, ...], meaning: str
) -> Array | None:
    """An initial state `zi` as an inexact array of `shape`, or `None` if absent.

    `meaning` says what the state holds, for the error message.
    """
    if zi is None:
        return None
    zi = inexact("zi", zi)
    if zi.shape != shape:
        raise ValueError(
            f"`zi` must be {meaning}, shape {shape}, got shape {zi.shape}."
        )
    return zi


def _must(low, high, low_open: bool, high_open: bool) -> str:
    if low is None and high is None:
        return "must be finite"
    lo = "(" if low_open else "["
    hi = ")" if high_open else "]"
    low = "-inf" if low is None else low
    high = "inf" if high is None else high
    return f"must be finite and lie in {lo}{low}, {high}{hi}"


def _out_of_range(xp, value, low, high, low_open: bool, high_open: bool):
    """Entrywise: non-finite or outside the interval; `xp` is numpy or jnp."""
    bad = ~xp.isfinite(value)
    if low is not None:
        bad = bad | (value <= low if low_open else value < low)
    if high is not None:
        bad = bad | (value >= high if high_open else value > high)
    return bad


def check_in_range(
    name: str,
    value: Array,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = True,
    high_open: bool = True,
) -> Array:
    """Raise at run time (also under `jit`) unless every entry of `value` is
    finite and lies between `low` and `high` (`None`: unbounded).

    Parameters and coefficients go through this check; signals do not (their
    non-finite samples pass through, as in scipy). The check is only kept by
    JAX if the returned array is used.
    """
    bad = _out_of_range(jnp, value, low, high, low_open, high_open)
    return error_if(
        value,
        jnp.any(bad),
        f"`{name}` {_must(low, high, low_open, high_open)}.",
    )


def check_init_range(
    name: str,
    value: Array,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = True,
    high_open: bool = True,
) -> Array:
    """`check_in_range` for a module's constructor: a concrete `value` raises
    `ValueError` at once; a traced one (a module built under `jit`) is checked
    with `eqx.error_if`, with the same message. Returns `value`."""
    if isinstance(value, jax.core.Tracer):
        return check_in_range(
            name, value, low, high, low_open=low_open, high_open=high_open
        )
    bad = _out_of_range(np, np.asarray(value), low, high, low_open, high_open)
    if np.any(bad):
        raise ValueError(
            f"`{name}` {_must(low, high, low_open, high_open)}, got {value!r}."
        )
    return value


def check_rate(name: str, value: float | int) -> float:
    """A sample rate, a static Python number: positive and finite.

    It fixes the frequency scale of a filter (and is a static field of the
    modules), so it is checked at once with `ValueError`, never traced.
    """
    if isinstance(value, bool):
        raise TypeError(f"`{name}` must be a Python number, got {value!r}.")
    try:
        rate = float(value)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise TypeError(
            f"`{name}` must be a Python number (it is static), got {value!r}."
        ) from None
    if not (np.isfinite(rate) and rate > 0):
        raise ValueError(f"`{name}` must be a positive, finite number, got {value!r}.")
    return rate


def real_array(name: str, value: ArrayLike) -> Array:
    """`value` as a real inexact array, for ops defined on real signals."""
    value = inexact(name, value)
    if jnp.issubdtype(value.dtype, jnp.complexfloating):
        raise TypeError(f"`{name}` must be real, got {value.dtype}.")
    return value


def check_delay(name: str, delay: object, minimum: int = 1) -> int:
    """An integer delay length in samples, a static Python `int` `>= minimum`
    (`1` for a delay line, `0` for a lookahead; it fixes shapes, so it is
    never traced)."""
    if (
        isinstance(delay, bool)
        or not isinstance(delay, (int, np.integer))
        or delay < minimum
    ):
        raise ValueError(
            f"`{name}` must be a Python int >= {minimum} (a length in samples, "
            f"fixed when the program is traced), got {delay!r}."
        )
    return int(delay)


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
    if isinstance(value, jax.Array) and (
        isinstance(value, jax.core.Tracer)
        or not _raising()
        or not value.is_fully_addressable
    ):
        return error_if(value, jnp.any(bad(jnp, value)), msg)
    # Concrete values, JAX arrays included, are checked on the host with
    # NumPy: each eager `jnp` op would compile its own small XLA program (a
    # dozen for a module's constructor) to decide what NumPy decides at once.
    flag = bad(np, np.asarray(value))
    if isinstance(flag, jax.Array):  # `bad` involves a JAX value (e.g. a bound)
        return error_if(jnp.asarray(value), jnp.any(flag), msg)
    if np.any(flag):
        # a JAX array's failed check raises as `error_if` raises it
        raise (InvalidArgumentError if isinstance(value, jax.Array) else ValueError)(
            msg
        )
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


def check_t_range(t_range: Any) -> tuple[float, float]:
    """`t_range`, an interval `(t0, t1)` of diffusion times with
    `0 <= t0 < t1 <= 1`, as two Python floats (a `ValueError` otherwise)."""
    t0, t1 = (static_float("t_range", v) for v in t_range)
    if not 0.0 <= t0 < t1 <= 1.0:
        raise ValueError(
            f"`t_range` must be an interval (t0, t1) with 0 <= t0 < t1 <= 1, "
            f"got {t_range}."
        )
    return t0, t1


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
