"""The exact proximal operator of a Gaussian mixture."""

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jaxtyping import Array, ArrayLike, Float

from .._never_silent import never_silent
from .._validate import check_positive_int
from ._mixture import GaussianMixtureEps
from ._prox import AbstractProximalPredictor, _as_lam
from ._schedule import AbstractNoiseSchedule
from ._solution import RESULTS
from ._state import as_state, time_like


class MixtureProx(AbstractProximalPredictor):
    r"""The exact proximal operator of a Gaussian mixture's $-\log p_t$.

    Minimises $F(u) = \tfrac12\lVert u - v\rVert^2 - \lambda\log p_t(u)$ for
    the noised mixture of a `retrax.diffusion.GaussianMixtureEps` by
    Newton's method with Armijo backtracking, started at $v$: a Newton step
    where $\nabla^2 F = I - \lambda\nabla^2\log p_t$ is positive definite,
    otherwise a gradient step; the backtracking halves the step (at most 40
    times) until the decrease is sufficient. The iteration count is bounded
    (`steps`; it stops early once the step is at rounding level), so it jits
    and vmaps. It uses
    $\nabla\log p_t$ directly, so it is valid at $t = 0$ (if every scale is
    positive). Where $-\log p_t$ is not convex the prox may be multivalued:
    this returns the local minimiser reached from $v$.

    Derivatives are implicit (`jax.lax.custom_root`): $\partial u/\partial v =
    (\nabla^2 F)^{-1}$, and likewise for $t$, $\lambda$ and the mixture's
    parameters; the Newton loop is never differentiated.

    A solve that does not reach a proximal point is never silent: when the
    line search finds no acceptable step (`RESULTS.prox_search_failed`) or
    `steps` run out (`RESULTS.nonlinear_max_steps_reached`),
    `prox_result` returns that code and `prox` makes every derivative of its
    answer NaN; [`retrax.diffusion.prox_infer`][] and
    [`retrax.diffusion.proxdm_sample`][] carry the code into their results.

    **Arguments:**

    - `mixture`: the Gaussian mixture (its schedule is this prox's schedule).
    - `steps`: the most Newton iterations (quadratic convergence: 50 is
      ample).
    """

    mixture: GaussianMixtureEps
    steps: int = eqx.field(default=50, static=True)

    def __check_init__(self):
        check_positive_int("steps", self.steps)

    @property
    def schedule(self) -> AbstractNoiseSchedule:
        return self.mixture.schedule

    def prox(
        self,
        v: Float[ArrayLike, " n"],
        t: Float[ArrayLike, ""] | float,
        lam: Float[ArrayLike, ""] | float,
    ) -> Float[Array, " n"]:
        u, result = self.prox_result(v, t, lam)
        ok = result == RESULTS.successful
        return never_silent(u, (v, t, lam, self.mixture), ok)

    def prox_result(
        self,
        v: Float[ArrayLike, " n"],
        t: Float[ArrayLike, ""] | float,
        lam: Float[ArrayLike, ""] | float,
    ) -> tuple[Float[Array, " n"], RESULTS]:
        v = as_state("v", v)
        if v.ndim != 1:
            raise ValueError(f"`v` must be a vector of shape (n,), got {v.shape}.")
        t = time_like(t, v)
        lam = _as_lam(lam, v.dtype)
        mix = self.mixture
        n = v.shape[0]
        eye = jnp.eye(n, dtype=v.dtype)

        def residual(u):
            # grad F = u - v - lam grad log p_t(u)
            _, grad, _ = mix.logdensity_derivatives(u, t)
            return u - v - lam * grad

        def objective(u):
            return 0.5 * jnp.sum((u - v) ** 2) - lam * mix.logdensity(u, t)

        tiny = 10 * jnp.finfo(v.dtype).eps

        def newton(carry):
            i, u, _, _ = carry
            logp, grad, hess = mix.logdensity_derivatives(u, t)
            r = u - v - lam * grad
            k = eye - lam * hess
            chol = jnp.linalg.cholesky(0.5 * (k + k.T))
            convex = jnp.all(jnp.isfinite(chol))
            safe = jnp.where(convex, chol, eye)
            d = jnp.where(convex, -jsl.cho_solve((safe, True), r), -r)
            f0 = 0.5 * jnp.sum((u - v) ** 2) - lam * logp
            slope = jnp.dot(r, d)
            # Armijo with a rounding allowance: near the solution the decrease
            # is below the resolution of F, and the full Newton step is right
            slack = tiny * (1 + jnp.abs(f0))

            def shrink(state):
                eta, _ = state
                return eta / 2, objective(u + eta / 2 * d)

            def too_high(state):
                eta, f = state
                return (f > f0 + 1e-4 * eta * slope + slack) & (eta > 2.0**-40)

            one = jnp.ones((), v.dtype)
            eta, f = jax.lax.while_loop(too_high, shrink, (one, objective(u + d)))
            accepted = f <= f0 + 1e-4 * eta * slope + slack
            step = jnp.where(accepted, eta, 0.0) * d
            done = jnp.max(jnp.abs(step)) <= tiny * (1 + jnp.max(jnp.abs(u)))
            # No acceptable step from a point that is not yet a minimiser: the
            # search failed (a non-finite objective, or rounding), not converged.
            failed = ~accepted
            return i + 1, u + step, done | failed, failed

        def loop(u0):
            def keep_going(carry):
                i, _, done, _ = carry
                return (i < self.steps) & ~done

            no = jnp.zeros((), bool)
            init = (jnp.zeros((), jnp.int32), u0, no, no)
            return jax.lax.while_loop(keep_going, newton, init)

        def solve(_, u0):
            # The flags as floats: custom_root's JVP gives boolean auxiliary
            # outputs a boolean tangent, which JAX then rejects.
            _, u, done, failed = loop(u0)
            return u, jnp.stack([done, failed]).astype(u.dtype)

        def tangent_solve(g, y):
            return jnp.linalg.solve(jax.jacfwd(g)(y), y)

        u, flags = jax.lax.custom_root(residual, v, solve, tangent_solve, has_aux=True)
        done, failed = jax.lax.stop_gradient(flags) > 0
        result = RESULTS.where(
            failed,
            RESULTS.prox_search_failed,
            RESULTS.where(
                done, RESULTS.successful, RESULTS.nonlinear_max_steps_reached
            ),
        )
        return u, result
