"""Input conventions shared by the diffusion API: states, times and keys."""

from typing import Any

import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

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


def as_state(name: str, x: ArrayLike) -> Float[Array, "..."]:
    """Convert `x` to a real floating array, rejecting other dtypes by name."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(
            f"`{name}` must have a real floating dtype, got {x.dtype}. Convert it "
            f"first, e.g. `{name}.astype(jnp.float32)`."
        )
    return x


def as_state_like(
    name: str, x: ArrayLike, ref_name: str, ref: Array
) -> Float[Array, "..."]:
    """`as_state`, and `x` must have the shape of `ref` (named `ref_name`)."""
    x = as_state(name, x)
    if x.shape != ref.shape:
        raise ValueError(
            f"`{name}` must have the shape of `{ref_name}`: got {x.shape} and "
            f"{ref.shape}."
        )
    return x
