"""Input conventions shared by `retrax.diffusion` and `retrax.relations`: states."""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float


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
