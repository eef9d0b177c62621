"""Gaussian-mixture data distributions with exact noise predictors."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from .._validate import check_value
from ._predictor import AbstractExactPredictor
from ._schedule import AbstractNoiseSchedule
from ._state import as_state, as_state_like, time_like


class GaussianMixtureEps(AbstractExactPredictor):
    r"""The exact noise predictor of a Gaussian-mixture data distribution.

    Data $x_0 \sim \sum_j w_j N(\mu_j, s_j^2 I)$ noised by the schedule has
    $p_t(x) = \sum_j w_j N(x; \alpha_t \mu_j, c_j I)$ with
    $c_j = \alpha_t^2 s_j^2 + \sigma_t^2$. With $u_j = (x - \alpha_t\mu_j)/c_j$
    and responsibilities $\gamma_j \propto w_j N(x; \alpha_t\mu_j, c_j I)$
    (computed by log-sum-exp), the optimal noise prediction is
    $\epsilon^* = -\sigma_t \nabla \log p_t = \sigma_t \sum_j \gamma_j u_j$.
    Its Jacobian (`jacobian`, symmetric) and its VJP with respect to the means
    (`vjp_means`) are closed forms. Weights need not be normalised; zero
    weights are empty components.

    **Arguments:**

    - `schedule`: the noise schedule.
    - `means`: the component means, shape `(m, n)`.
    - `scales`: the per-component standard deviations $s_j$, shape `(m,)` or
      a scalar shared by all components. Zero is allowed for $t > 0$.
    - `weights`: the nonnegative component weights, shape `(m,)`; equal by
      default.
    """

    schedule: AbstractNoiseSchedule
    means: Float[Array, "m n"]
    scales: Float[Array, " m"]
    weights: Float[Array, " m"]

    def __init__(
        self,
        schedule: AbstractNoiseSchedule,
        means: Float[ArrayLike, "..."],
        scales: Float[ArrayLike, "..."] | float,
        weights: Float[ArrayLike, "..."] | None = None,
    ):
        means = as_state("means", means)
        if means.ndim != 2 or means.shape[0] == 0:
            raise ValueError(
                "`means` must have shape (components, dim) with at least one "
                f"component, got shape {means.shape}."
            )
        m = means.shape[0]
        scales = jnp.asarray(scales)
        if not jnp.issubdtype(scales.dtype, jnp.floating):
            scales = scales.astype(means.dtype)
        if scales.ndim == 0:
            scales = jnp.broadcast_to(scales, (m,))
        if scales.shape != (m,):
            raise ValueError(
                f"`scales` must be a scalar or have shape ({m},), one per "
                f"component, got shape {scales.shape}."
            )
        if weights is None:
            # built on the host and moved with `device_put`: `jnp.full` (and
            # `jnp.asarray` of a host array) would compile a program for it
            weights = jax.device_put(np.full((m,), 1.0 / m, dtype=means.dtype))
        weights = jnp.asarray(weights)
        if not jnp.issubdtype(weights.dtype, jnp.floating):
            weights = weights.astype(means.dtype)
        if weights.shape != (m,):
            raise ValueError(
                f"`weights` must have shape ({m},), one per component, got "
                f"shape {weights.shape}."
            )
        means = check_value(
            means, lambda xp, v: ~xp.isfinite(v), "`means` must be finite."
        )
        scales = check_value(
            scales,
            lambda xp, v: ~(v >= 0) | ~xp.isfinite(v),
            "`scales` must be finite, nonnegative standard deviations.",
        )
        weights = check_value(
            weights,
            lambda xp, v: ~(v >= 0) | ~xp.isfinite(v) | ~(xp.sum(v) > 0),
            "`weights` must be finite and nonnegative with a positive sum.",
        )
        self.schedule = schedule
        self.means = means
        self.scales = scales.astype(means.dtype)
        self.weights = weights.astype(means.dtype)

    def _terms(self, x, t):
        dtype = x.dtype
        # `t` was checked by the public method (`time_like`): the schedule's
        # unchecked formulas stage no second check per evaluation
        schedule = self.schedule
        alpha = schedule._alpha(t)
        sigma2 = schedule._sigma2(t)
        sigma = jnp.sqrt(sigma2)
        mu = self.means.astype(dtype)
        if x.shape != mu.shape[1:]:
            raise ValueError(
                f"`x` must be one point of shape {mu.shape[1:]} (the means' "
                f"dimension), got shape {x.shape}."
            )
        # `c` from sigma^2, not from the square of sigma, whose square root
        # has an infinite derivative at t = 0: forward mode (which carries a
        # zero tangent for t) would give 0 * inf = NaN there.
        c = alpha**2 * self.scales.astype(dtype) ** 2 + sigma2
        d = x - alpha * mu
        u = d / c[:, None]
        w = self.weights.astype(dtype)
        w = w / jnp.sum(w)
        n = x.shape[0]
        loglik = -0.5 * n * jnp.log(2 * jnp.pi * c) - 0.5 * jnp.sum(d * u, axis=-1)
        # Log-sum-exp with the weights as multipliers rather than log-weights,
        # so that an empty (zero-weight) component still has the correct,
        # nonzero derivative with respect to its weight. The shift is the
        # largest live log-likelihood; the cap only bounds the terms of empty
        # components, which may lie above it.
        shift = jax.lax.stop_gradient(jnp.max(jnp.where(w > 0, loglik, -jnp.inf)))
        scaled = w * jnp.exp(jnp.minimum(loglik - shift, 50.0))
        total = jnp.sum(scaled)
        gamma = scaled / total
        return alpha, sigma, c, u, gamma, shift + jnp.log(total)

    def logdensity(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, ""]:
        r"""The log-density $\log p_t(x)$ of the noised mixture.

        **Arguments:**

        - `x`: one point, shape `(n,)`.
        - `t`: its scalar diffusion time in `[0, 1]`.

        **Returns:**

        The scalar log-density.
        """
        x = as_state("x", x)
        t = time_like(t, x)
        *_, logp = self._terms(x, t)
        return logp

    def logdensity_derivatives(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> tuple[Float[Array, ""], Float[Array, " n"], Float[Array, "n n"]]:
        r"""$\log p_t(x)$ with its gradient and Hessian, in closed form.

        $\nabla\log p_t = -\bar u$ and $\nabla^2\log p_t = -[\sum_j
        \gamma_j/c_j\, I - \sum_j\gamma_j u_j u_j^\top + \bar u\bar
        u^\top]$, $\bar u = \sum_j\gamma_j u_j$. Unlike the score
        $-\hat\epsilon/\sigma_t$ these are finite at $t = 0$ (when every
        scale is positive).

        **Arguments:**

        - `x`: one point, shape `(n,)`.
        - `t`: its scalar diffusion time in `[0, 1]`.

        **Returns:**

        A tuple `(logp, grad, hess)`: the scalar log-density, its gradient
        `(n,)` and its symmetric Hessian `(n, n)`.
        """
        x = as_state("x", x)
        t = time_like(t, x)
        _, _, c, u, gamma, logp = self._terms(x, t)
        ubar = gamma @ u
        n = x.shape[0]
        hess = (
            jnp.sum(gamma / c) * jnp.eye(n, dtype=x.dtype)
            - (u * gamma[:, None]).T @ u
            + jnp.outer(ubar, ubar)
        )
        return logp, -ubar, -hess

    @property
    def conservative(self) -> bool:
        r"""True: $\epsilon^* = \sigma_t\nabla_x(-\log p_t)$."""
        return True

    def potential(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, ""]:
        r"""$-\log p_t(x)$ (see `logdensity`)."""
        return -self.logdensity(x, t)

    def epsilon(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, " n"]:
        x = as_state("x", x)
        t = time_like(t, x)
        _, sigma, _, u, gamma, _ = self._terms(x, t)
        return sigma * (gamma @ u)

    def jacobian(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, "n n"]:
        r"""The exact Jacobian $\partial\epsilon^*/\partial x$.

        It is $-\sigma_t \nabla^2 \log p_t$:

        $\sigma_t\,[\sum_j \gamma_j/c_j\, I - \sum_j \gamma_j u_j u_j^\top +
        \bar u \bar u^\top]$, $\bar u = \sum_j \gamma_j u_j$; symmetric.

        **Arguments:**

        - `x`: one point, shape `(n,)`.
        - `t`: its scalar diffusion time.

        **Returns:**

        The `(n, n)` Jacobian.
        """
        x = as_state("x", x)
        t = time_like(t, x)
        _, sigma, c, u, gamma, _ = self._terms(x, t)
        ubar = gamma @ u
        n = x.shape[0]
        diag = jnp.sum(gamma / c) * jnp.eye(n, dtype=x.dtype)
        second = (u * gamma[:, None]).T @ u
        return sigma * (diag - second + jnp.outer(ubar, ubar))

    def vjp_means(
        self,
        x: Float[ArrayLike, " n"],
        t: Float[ArrayLike, ""] | float,
        w: Float[ArrayLike, " n"],
    ) -> Float[Array, "m n"]:
        r"""The exact cotangent $w^\top \partial\epsilon^*/\partial\mu_j$ of each mean.

        $\sigma_t\alpha_t\gamma_j\,[u_j\, w^\top(u_j - \bar u) - w / c_j]$.

        **Arguments:**

        - `x`: one point, shape `(n,)`.
        - `t`: its scalar diffusion time.
        - `w`: the output cotangent, shape `(n,)`.

        **Returns:**

        The cotangent for `means`, shape `(m, n)`.
        """
        x = as_state("x", x)
        t = time_like(t, x)
        w = as_state_like("w", w, "x", x).astype(x.dtype)
        alpha, sigma, c, u, gamma, _ = self._terms(x, t)
        ubar = gamma @ u
        proj = (u - ubar) @ w
        return (sigma * alpha) * gamma[:, None] * (u * proj[:, None] - w / c[:, None])


def mixture_logdensity(
    mixture: GaussianMixtureEps,
    x: Float[ArrayLike, " n"],
    t: Float[ArrayLike, ""] | float,
) -> Float[Array, ""]:
    r"""The log-density $\log p_t(x)$ of a noised Gaussian mixture.

    $\log \sum_j w_j N(x; \alpha_t\mu_j, (\alpha_t^2 s_j^2 + \sigma_t^2) I)$,
    with the weights normalised; at `t = 0` the data density itself.

    **Arguments:**

    - `mixture`: the mixture.
    - `x`: one point, shape `(n,)`.
    - `t`: the scalar diffusion time in `[0, 1]`.

    **Returns:**

    The scalar log-density.
    """
    return mixture.logdensity(x, t)
