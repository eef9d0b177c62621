"""Private input checks shared by the filter ops."""

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike

from .._errors import error_if
from .._misc import as_inexact


def check_signal(name: str, x: Array) -> None:
    """A single signal of shape `(time,)` (batch with `jax.vmap`)."""
    if x.ndim != 1:
        raise ValueError(
            f"`{name}` must be one signal of shape (time,), got shape {x.shape}. "
            "Batch several signals with `jax.vmap`."
        )


def check_finite(name: str, value: Array) -> Array:
    """Raise at run time (also under `jit`) if `value` has a `nan` or `inf`.

    The check is only kept by JAX if the returned array is used. It also
    holds inside `shard_map` (see `retrax._errors.error_if`).
    """
    return error_if(
        value,
        ~jnp.all(jnp.isfinite(value)),
        f"`{name}` has non-finite (nan or inf) entries.",
    )


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
    zi = as_inexact("zi", zi)
    if zi.shape != shape:
        raise ValueError(
            f"`zi` must be {meaning}, shape {shape}, got shape {zi.shape}."
        )
    return zi
