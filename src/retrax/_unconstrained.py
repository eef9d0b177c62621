"""Effects' physical fields and their unconstrained parametrisation.

The effects store physical values (Hz, resonances, pole radii) as fields, so
`eqx.tree_at` replaces them and the call checks them. To train without
leaving the valid region, an effect maps a real vector $\\theta$ to its
fields through smooth bijections onto valid intervals, a logistic sigmoid for
a bounded interval and softplus for a half-line, and back
(`to_unconstrained` / `with_unconstrained`): every ranged effect through its
normalised vector, $u = \\sigma(\\theta)$ (see `_effect`), and the filters
onto their whole valid regions, wider than their ranges. The entries are clipped to
$[-15, 15]$ (sigmoid) and $[-15, \\infty)$ (softplus) first, where float32
would otherwise round the fields onto the ends of their intervals.
"""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike

from ._validate import check_value


def field_array(
    name: str,
    value: ArrayLike | Sequence[float | int],
    ndim: int = 0,
    *,
    default_float: bool = False,
) -> Array:
    """A physical field as a real, strongly typed float array with `ndim`
    axes. Integers become the default float, and so does every value with
    `default_float` (the constructors: one dtype for all fields, as the
    effects' constructors do); otherwise a floating value keeps its dtype.
    A wrong rank raises `ValueError` naming the field."""
    value = jnp.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.complexfloating):
        raise TypeError(f"`{name}` must be real, got {value.dtype}.")
    floating = jnp.issubdtype(value.dtype, jnp.floating)
    dtype = value.dtype if floating and not default_float else float
    # an explicit dtype makes a Python float strongly typed, so that an
    # optimiser's first update does not change the leaf's type (and recompile)
    value = jnp.asarray(value, dtype)
    if value.ndim != ndim:
        what = "a scalar" if ndim == 0 else f"an array with {ndim} axis"
        raise ValueError(f"`{name}` must be {what}, got shape {value.shape}.")
    return value


def unconstrained(
    name: str, theta: ArrayLike | Sequence[float | int], size: int
) -> Array:
    """`theta` as a real vector of shape `(size,)`, every entry finite (a
    wrong shape raises `ValueError` at once; non-finite entries raise, also
    under `jax.jit`)."""
    shape = np.shape(theta)
    if shape != (size,):
        raise ValueError(
            f"`{name}` must be the {size} unconstrained parameters of this effect, "
            f"shape ({size},), got shape {shape}. Build a batch with "
            "`eqx.filter_vmap`."
        )
    theta = field_array(name, theta, 1)
    return check_value(
        theta,
        lambda xp, v: ~xp.isfinite(v),
        f"`{name}` (unconstrained parameters) must be finite.",
    )


# Beyond this, float32 rounds the sigmoid to 1 (at about 17) and softplus to
# 0 (at about -87 to -104): the entries are clipped to it, so that every
# finite vector maps to a valid module in both precisions.
SATURATION = 15.0


def bounded(theta: Array) -> Array:
    """The logistic sigmoid of `theta` clipped to `[-15, 15]`: in $(0, 1)$
    for every finite `theta`, in float32 too."""
    return jax.nn.sigmoid(jnp.clip(theta, -SATURATION, SATURATION))


def positive(theta: Array) -> Array:
    """Softplus of `theta` clipped below at -15: positive for every finite
    `theta`, in float32 too."""
    return jax.nn.softplus(jnp.maximum(theta, -SATURATION))


def logit(p: Array) -> Array:
    """The inverse of the logistic sigmoid, for `p` in $(0, 1)$."""
    return jnp.log(p) - jnp.log1p(-p)


def softplus_inverse(v: Array) -> Array:
    """The inverse of softplus, $v + \\log(1 - e^{-v})$, for $v > 0$."""
    return v + jnp.log(-jnp.expm1(-v))
