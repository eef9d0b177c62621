"""Stable parametrisations of recursive filters for gradient-based training."""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Inexact, Shaped

from .._misc import as_inexact
from .._unconstrained import SATURATION
from .._validate import check_finite


def rc2lpc(k: Shaped[ArrayLike, "*batch order"]) -> Inexact[Array, "*batch order"]:
    r"""Reflection coefficients to all-pole (LPC) coefficients: the step-up recursion.

    Starting from $a^{(1)} = [k_0]$, each stage appends one coefficient:
    $a^{(m+1)}_i = a^{(m)}_i + k_m a^{(m)}_{m-1-i}$ for $i < m$ and
    $a^{(m+1)}_m = k_m$. The filter $1 / (1 + \sum_i a_i z^{-i-1})$ is stable
    exactly when every $|k_m| < 1$, so training `jnp.tanh(theta)` as the
    reflection coefficients keeps every gradient step stable.

    **Arguments:**

    - `k`: reflection coefficients, shape `(..., K)`; leading axes (e.g. time)
      are carried along.

    **Returns:**

    The coefficients `a` for `allpole` (leading 1 dropped), shape `(..., K)`.

    Non-finite `k` raise an error (also under `jax.jit`).
    """
    k = as_inexact("k", k)
    if k.ndim < 1 or k.shape[-1] == 0:
        raise ValueError(
            f"`k` must have shape (..., order) with order >= 1, got {k.shape}."
        )
    k = check_finite("k", k)
    a = k[..., :1]
    for m in range(1, k.shape[-1]):
        km = k[..., m : m + 1]
        a = jnp.concatenate([a + km * a[..., ::-1], km], axis=-1)
    return a


def lpc2rc(a: Shaped[ArrayLike, "*batch order"]) -> Inexact[Array, "*batch order"]:
    r"""All-pole coefficients to reflection coefficients: the step-down recursion.

    The inverse of `rc2lpc`. A filter is stable exactly when every returned
    coefficient has magnitude below 1; a coefficient of magnitude 1 (a pole on
    the unit circle) makes the recursion divide by zero and returns non-finite
    values.

    **Arguments:**

    - `a`: the coefficients without the leading 1, shape `(..., K)`.

    **Returns:**

    The reflection coefficients, shape `(..., K)`.

    Non-finite `a` raise an error (also under `jax.jit`).
    """
    a = as_inexact("a", a)
    if a.ndim < 1 or a.shape[-1] == 0:
        raise ValueError(
            f"`a` must have shape (..., order) with order >= 1, got {a.shape}."
        )
    a = check_finite("a", a)
    out = []
    for m in range(a.shape[-1] - 1, -1, -1):
        km = a[..., m : m + 1]
        out.append(km)
        if m:
            head = a[..., :m]
            a = (head - km * head[..., ::-1]) / (1 - km * km)
    return jnp.concatenate(out[::-1], axis=-1)


def biquad_denominator(
    radius: Shaped[ArrayLike, "*batch"], angle: Shaped[ArrayLike, "*batch"]
) -> Float[Array, "*batch 2"]:
    r"""The denominator of a conjugate pole pair at $r e^{\pm i\theta}$.

    $1 - 2 r \cos\theta\, z^{-1} + r^2 z^{-2}$, returned without the leading
    1 as `[-2 r cos(theta), r^2]` for `allpole`/`lfilter`. Stable for
    $0 \le r < 1$: train e.g. `radius = max_radius * jax.nn.sigmoid(p)`.

    **Arguments:**

    - `radius`: pole radius.
    - `angle`: pole angle in radians ($2\pi f / f_s$ for a resonance at $f$).

    **Returns:**

    The two coefficients, shape `(..., 2)`.

    Non-finite `radius` or `angle` raise an error (also under `jax.jit`).
    """
    radius = check_finite("radius", as_inexact("radius", radius))
    angle = check_finite("angle", as_inexact("angle", angle))
    return jnp.stack(jnp.broadcast_arrays(-2 * radius * jnp.cos(angle), radius**2), -1)


# The gains of the unconstrained maps lie within this many dB of 0 dB: the
# sections' coefficients stay finite and well scaled in float32 (unbounded,
# an entry of 1e6 made the shelf and peak gains $10^{g/40}$ overflow).
GAIN_LIMIT_DB = 60.0


def gain_db_from_unconstrained(theta: Array) -> Array:
    r"""The gain in dB of an unconstrained entry, $g = G \tanh(\theta / G)$
    with $G$ = `GAIN_LIMIT_DB`: $g \approx \theta$ for small $\theta$ (slope 1
    at 0 dB), $|g| \le G$ for every finite $\theta$."""
    return GAIN_LIMIT_DB * jnp.tanh(theta / GAIN_LIMIT_DB)


def gain_db_to_unconstrained(gain_db: Array) -> Array:
    r"""The inverse of `gain_db_from_unconstrained`,
    $\theta = G \operatorname{artanh}(g / G)$; a gain at or beyond $\pm G$
    maps to $\pm 15 G$ (where $\tanh$ has rounded to 1)."""
    u = jnp.clip(gain_db / GAIN_LIMIT_DB, -1.0, 1.0)
    limit = SATURATION * GAIN_LIMIT_DB
    return jnp.clip(GAIN_LIMIT_DB * jnp.arctanh(u), -limit, limit)
