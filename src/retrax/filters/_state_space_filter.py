"""A learnable modal filter on `diag_state_space`, stable for every parameter value."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from .._misc import as_inexact
from .._validate import check_in_range, check_positive_int
from ..ops import diag_state_space


class StateSpaceFilter(eqx.Module):
    """A learnable real filter in modal form with bounded pole radius.

    `n_modes` complex-conjugate pole pairs $p_j = r_j e^{i\\theta_j}$ with
    $r_j = r_{\\max}\\,\\sigma(\\rho_j)$, so the filter is stable for every
    parameter value, and complex input and output weights; the output is
    $y = 2\\,\\mathrm{Re} \\sum_j c_j h_j + d\\,x$ with
    $h_{t+1} = p \\odot h_t + b\\,x_t$
    (`diag_state_space`), which equals a real system of order `2 n_modes`.
    All parameters are stored as real arrays (real and imaginary parts kept
    apart), so optax treats them as ordinary real leaves.

    **Arguments:**

    - `n_modes`: the number of pole pairs.
    - `key`: a PRNG key for the initial weights.
    - `max_radius`: the largest pole radius (default 0.9995).
    """

    raw_radius: Float[Array, " modes"]
    angle: Float[Array, " modes"]
    b: Float[Array, "modes 2"]
    c: Float[Array, "modes 2"]
    d: Float[Array, ""]
    max_radius: float = eqx.field(static=True)

    def __init__(self, n_modes: int, key: PRNGKeyArray, max_radius: float = 0.9995):
        check_positive_int("n_modes", n_modes)
        if not 0 < max_radius < 1:
            raise ValueError(f"`max_radius` must lie in (0, 1), got {max_radius!r}.")
        k1, k2, k3 = jax.random.split(key, 3)
        self.raw_radius = jnp.zeros(n_modes, float) + 2.0
        self.angle = jnp.linspace(0.05, 3.0, n_modes, dtype=float)
        self.b = jax.random.normal(k1, (n_modes, 2), float) / jnp.sqrt(n_modes)
        self.c = jax.random.normal(k2, (n_modes, 2), float) / jnp.sqrt(n_modes)
        self.d = jax.random.normal(k3, (), float) * 0.1
        self.max_radius = float(max_radius)

    @property
    def poles(self) -> Array:
        """The complex poles (one of each conjugate pair)."""
        radius = self.max_radius * jax.nn.sigmoid(self.raw_radius)
        return jax.lax.complex(
            radius * jnp.cos(self.angle), radius * jnp.sin(self.angle)
        )

    def __call__(self, x: Shaped[ArrayLike, " time"]) -> Float[Array, " time"]:
        """Filter one real signal `(T,)`; batch with `jax.vmap`."""
        x = as_inexact("x", x)
        ctype = jnp.complex128 if x.dtype == jnp.float64 else jnp.complex64
        poles = self.poles.astype(ctype)
        b = jax.lax.complex(self.b[:, 0], self.b[:, 1]).astype(ctype)[:, None]
        c = jax.lax.complex(self.c[:, 0], self.c[:, 1]).astype(ctype)[None, :]
        # A conjugate pair contributes 2 Re(c h): the real system's output.
        y = diag_state_space(x.astype(ctype)[:, None], a=poles, B=b, C=2 * c, D=None)
        d = check_in_range("d", self.d)
        return jnp.real(y[:, 0]) + d.astype(x.dtype) * x
