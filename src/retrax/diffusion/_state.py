"""Input conventions of the diffusion API: times and keys (states: `retrax._state`)."""

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._state import as_state as as_state, as_state_like as as_state_like
from ._schedule import as_time


def is_key(x: Any) -> bool:
    """Whether `x` is one PRNG key (a scalar typed key or a legacy `uint32[2]`)."""
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return False
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return jnp.ndim(x) == 0
    return dtype == jnp.uint32 and jnp.shape(x) == (2,)


def time_like(t: Float[ArrayLike, ""] | float, x: Array) -> Float[Array, ""]:
    """Check a scalar time and cast it to the dtype of `x`."""
    t = as_time(t)
    if t.ndim != 0:
        raise ValueError(
            f"`t` must be a scalar time for one example, got shape {t.shape}. "
            "Batch several examples with `jax.vmap`."
        )
    return t.astype(x.dtype)
