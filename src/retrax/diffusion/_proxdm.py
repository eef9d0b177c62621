"""Proximal diffusion models (ProxDM): proximal operators of -log p_t as priors."""

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
import numpy as np
import optimistix as optx
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._errors import error_if
from .._misc import check_positive_int, check_value
from ._mixture import GaussianMixtureEps
from ._never_silent import never_silent
from ._predictor import as_state, as_state_like, is_key, time_like
from ._sample import _dtype
from ._schedule import AbstractNoiseSchedule
from ._solution import RESULTS


def _as_lam(lam, dtype, *, positive: bool = False) -> Array:
    """A checked scalar prox strength of `dtype` (eagerly and under `jit`)."""
    if np.ndim(lam) != 0:
        raise ValueError(f"`lam` must be a scalar, got shape {np.shape(lam)}.")
    kind = jnp.result_type(lam)
    if not jnp.issubdtype(kind, jnp.number) or jnp.issubdtype(
        kind, jnp.complexfloating
    ):
        raise TypeError(f"`lam` must be a real number, got dtype {kind}.")
    if positive:
        msg, bad = "`lam` must be positive and finite.", lambda xp, v: ~(v > 0)
    else:
        msg, bad = "`lam` must be nonnegative and finite.", lambda xp, v: ~(v >= 0)
    lam = check_value(lam, lambda xp, v: bad(xp, v) | ~xp.isfinite(v), msg)
    return jnp.asarray(lam).astype(dtype)


def _max_norm(x) -> Array:
    # in the default float, the dtype of FixedPointIteration's initial error,
    # so that float32 solves also run with x64 enabled
    return optx.max_norm(x).astype(jnp.result_type(float))


class AbstractProximalPredictor(eqx.Module):
    r"""A proximal operator of the noised data's negative log-density.

    $\mathrm{prox}_{-\lambda\log p_t}(v) = \arg\min_u \tfrac12\lVert u - v
    \rVert^2 - \lambda\log p_t(u)$, a MAP denoiser at noise level $t$; its
    optimality condition $u - v = \lambda\nabla\log p_t(u)$ is a backward
    (implicit) gradient step. Proximal diffusion models (Fang, Díaz,
    Buchanan and Sulam, "Beyond scores: proximal diffusion models",
    arXiv:2507.08956) sample and infer with this map in place of the score.
    Works on one example; batch with `jax.vmap`.

    Subclasses define `prox`, `prox_result` and the field `schedule`.
    """

    schedule: eqx.AbstractVar[AbstractNoiseSchedule]

    @abc.abstractmethod
    def prox(
        self,
        v: Float[ArrayLike, " n"],
        t: Float[ArrayLike, ""] | float,
        lam: Float[ArrayLike, ""] | float,
    ) -> Float[Array, " n"]:
        r"""The proximal map $\mathrm{prox}_{-\lambda\log p_t}(v)$.

        **Arguments:**

        - `v`: the point, shape `(n,)`.
        - `t`: the scalar diffusion time in `[0, 1]`.
        - `lam`: the strength $\lambda \ge 0$.

        **Returns:**

        The proximal point, shaped and typed like `v`.
        """

    @abc.abstractmethod
    def prox_result(
        self,
        v: Float[ArrayLike, " n"],
        t: Float[ArrayLike, ""] | float,
        lam: Float[ArrayLike, ""] | float,
    ) -> tuple[Float[Array, " n"], RESULTS]:
        r"""The proximal map and the result code of computing it.

        For a prox given in closed form or by a network the result is always
        `RESULTS.successful`; for one computed by an inner solve
        ([`retrax.diffusion.MixtureProx`][]) it says whether that solve
        reached a proximal point. The point's derivatives are those of the
        map whatever the result: callers that differentiate check the result
        (`prox` itself makes them NaN on a failure).

        **Arguments:**

        - `v`: the point, shape `(n,)`.
        - `t`: the scalar diffusion time in `[0, 1]`.
        - `lam`: the strength $\lambda \ge 0$.

        **Returns:**

        A tuple `(u, result)`: the proximal point, shaped and typed like `v`,
        and a [`retrax.diffusion.RESULTS`][] code.
        """


def default_prox_input(
    v: Float[Array, " n"], t: Float[Array, ""], lam: Float[Array, ""]
) -> tuple[Float[Array, " n"], Float[Array, ""], Float[Array, ""]]:
    """The identity adapter: the model receives `(v, t, lam)` unchanged.

    **Arguments:**

    - `v`: the point.
    - `t`: its scalar diffusion time.
    - `lam`: the scalar prox strength.

    **Returns:**

    The triple `(v, t, lam)`.
    """
    return v, t, lam


class ProxNetwork(AbstractProximalPredictor):
    r"""A learned proximal operator in ProxDM's parametrisation.

    $f_\theta(v; t, \lambda) = v - \sqrt\lambda\,\hat\epsilon_\theta(v; t,
    \lambda)$ (Fang et al. 2025): the network predicts the normalised residual
    of the prox, conditioned on two scalars, $t$ and $\lambda$. Train it with
    [`retrax.diffusion.proximal_matching_loss`][].

    **Arguments:**

    - `model`: a callable module returning an array shaped like `v`, called as
      `model(*input(v, t, lam))`.
    - `schedule`: the noise schedule.
    - `input`: the adapter `input(v, t, lam)`; the identity by default.
    """

    model: Callable[..., Array]
    schedule: AbstractNoiseSchedule
    input: Callable[[Array, Array, Array], tuple[Any, ...]] = default_prox_input

    def epsilon(
        self,
        v: Float[ArrayLike, " n"],
        t: Float[ArrayLike, ""] | float,
        lam: Float[ArrayLike, ""] | float,
    ) -> Float[Array, " n"]:
        r"""The predicted normalised residual $\hat\epsilon_\theta(v; t, \lambda)$.

        **Arguments:**

        - `v`: the point, shape `(n,)`.
        - `t`: the scalar diffusion time.
        - `lam`: the strength $\lambda \ge 0$.

        **Returns:**

        $\hat\epsilon_\theta$, shaped and typed like `v`.
        """
        v = as_state("v", v)
        t = time_like(t, v)
        lam = _as_lam(lam, v.dtype)
        out = self.model(*self.input(v, t, lam))
        if not (hasattr(out, "shape") and out.shape == v.shape):
            raise ValueError(
                f"the model's output must have the shape of `v` {v.shape}, got "
                f"{getattr(out, 'shape', type(out))}."
            )
        return out.astype(v.dtype)

    def prox(
        self,
        v: Float[ArrayLike, " n"],
        t: Float[ArrayLike, ""] | float,
        lam: Float[ArrayLike, ""] | float,
    ) -> Float[Array, " n"]:
        v = as_state("v", v)
        lam = _as_lam(lam, v.dtype)
        return v - jnp.sqrt(lam) * self.epsilon(v, t, lam)

    def prox_result(
        self,
        v: Float[ArrayLike, " n"],
        t: Float[ArrayLike, ""] | float,
        lam: Float[ArrayLike, ""] | float,
    ) -> tuple[Float[Array, " n"], RESULTS]:
        return self.prox(v, t, lam), RESULTS.successful


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
            # grad F = u - v - lam grad log p_t(u), with grad log p_t = -ubar
            _, _, _, uj, gamma, _ = mix._terms(u, t)
            return u - v + lam * (gamma @ uj)

        def objective(u):
            *_, logp = mix._terms(u, t)
            return 0.5 * jnp.sum((u - v) ** 2) - lam * logp

        tiny = 10 * jnp.finfo(v.dtype).eps

        def newton(carry):
            i, u, _, _ = carry
            _, _, c, uj, gamma, logp = mix._terms(u, t)
            ubar = gamma @ uj
            r = u - v + lam * ubar
            hess = (
                jnp.sum(gamma / c) * eye
                - (uj * gamma[:, None]).T @ uj
                + jnp.outer(ubar, ubar)
            )
            k = eye + lam * hess
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


@eqx.filter_jit
def proxdm_sample(
    prox: AbstractProximalPredictor,
    key: PRNGKeyArray,
    shape: int | tuple[int, ...],
    *,
    steps: int = 50,
    hybrid: bool = False,
    t_start: float = 1.0,
    x_init: Float[ArrayLike, " n"] | None = None,
    dtype: DTypeLike | None = None,
    throw: bool = True,
) -> "ProxSample":
    r"""Draw one sample with ProxDM's sampler (Fang et al. 2025, Algorithm 1).

    From $X_N \sim N(0, I)$ (or a given $X_N$, `x_init`) on a uniform grid
    $0 = t_0 < \dots < t_N$ = `t_start`, with
    $\gamma_k = \int_{t_{k-1}}^{t_k}\beta(s)\,ds$ and $z_k \sim N(0, I)$:

    - PDA (backward Euler on the reverse SDE's drift):
      $X_{k-1} = \mathrm{prox}_{-\frac{2\gamma_k}{2-\gamma_k}\log p_{t_{k-1}}}
      \bigl(\tfrac{2}{2-\gamma_k}(X_k + \sqrt{\gamma_k}z_k)\bigr)$, which
      needs $\gamma_k < 2$;
    - PDA-hybrid (`hybrid=True`, implicit in the score only):
      $X_{k-1} = \mathrm{prox}_{-\gamma_k\log p_{t_{k-1}}}
      \bigl((1 + \tfrac12\gamma_k)X_k + \sqrt{\gamma_k}z_k\bigr)$.

    The last step is a prox at $t = 0$ (a MAP denoising step), so no separate
    final denoising is needed. One `lax.scan`.

    **Arguments:**

    - `prox`: the proximal operator.
    - `key`: a PRNG key; batch with `jax.vmap` over keys.
    - `shape`: the shape of one example, `(n,)` or `n`.
    - `steps`: the number of steps $N$.
    - `hybrid`: use PDA-hybrid instead of PDA.
    - `t_start`: the start time $t_N$ in `(0, 1]`.
    - `x_init`: the start $X_N$, of the given shape; a draw from $N(0, I)$
      by default (the noise distribution at $t_N = 1$). With `t_start < 1`,
      a data point noised to $t_N$ (`schedule.perturb(x0, t_start, eps)`)
      gives an SDEdit-style edit of that point. It must be finite;
      derivatives flow to it.
    - `dtype`: JAX's default float by default, or `x_init`'s dtype.
    - `throw`: whether a failed prox (see
      [`retrax.diffusion.AbstractProximalPredictor.prox_result`][]) raises.
      With `throw=False` the sample is returned with the first failure's
      result code and NaN derivatives.

    **Returns:**

    A [`retrax.diffusion.ProxSample`][]: the sample (of the given shape) and
    its result code. PDA with a step $\gamma_k \ge 2$ raises (use more steps
    or `hybrid=True`).
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if len(shape) != 1 or not (isinstance(shape[0], int) and shape[0] >= 1):
        raise ValueError(f"`shape` must be `(n,)` with n >= 1, got {shape}.")
    check_positive_int("steps", steps)
    t_start = check_value(
        t_start, lambda xp, v: ~((v > 0) & (v <= 1)), "`t_start` must lie in (0, 1]."
    )
    if x_init is not None:
        x_init = as_state("x_init", x_init)
        if x_init.shape != shape:
            raise ValueError(
                f"`x_init` must have the sample's shape {shape}, got {x_init.shape}."
            )
        dtype = _dtype(x_init.dtype if dtype is None else dtype)
        x_init = error_if(
            x_init.astype(dtype),
            ~jnp.all(jnp.isfinite(x_init)),
            "`x_init` must be finite.",
        )
    dtype = _dtype(dtype)
    sched = prox.schedule
    ts = jnp.linspace(0.0, t_start, steps + 1, dtype=dtype)
    big_b = sched.integrated_beta(ts)
    gammas = big_b[1:] - big_b[:-1]
    if not hybrid:
        gammas = error_if(
            gammas,
            jnp.any(gammas >= 2),
            "PDA needs every step's integrated rate gamma_k < 2: use more `steps` "
            "or `hybrid=True`.",
        )
    k_init, k_steps = jax.random.split(key)
    if x_init is None:
        x = jax.random.normal(k_init, shape, dtype)
    else:
        x = x_init
    keys = jax.random.split(k_steps, steps)

    def body(carry, inp):
        x, result = carry
        t_prev, gamma, k = inp
        z = jax.random.normal(k, shape, dtype)
        if hybrid:
            v, lam = (1 + gamma / 2) * x + jnp.sqrt(gamma) * z, gamma
        else:
            scale = 2 / (2 - gamma)
            v, lam = scale * (x + jnp.sqrt(gamma) * z), gamma * scale
        x, step_result = prox.prox_result(v, t_prev, lam)
        # keep the first failure
        result = RESULTS.where(result == RESULTS.successful, step_result, result)
        return (x, result), None

    init = (x, RESULTS.successful)
    (x, result), _ = jax.lax.scan(body, init, (ts[:-1], gammas, keys), reverse=True)
    x = never_silent(x, (prox, x_init), result == RESULTS.successful)
    out = ProxSample(x=x, result=result)
    if throw:
        out = result.error_if(out, result != RESULTS.successful)
    return out


class ProxSample(eqx.Module):
    """The result of [`retrax.diffusion.proxdm_sample`][].

    **Attributes:**

    - `x`: the sample.
    - `result`: a [`retrax.diffusion.RESULTS`][] code: `successful`, or the
      first failure of a prox along the chain (then the derivatives of `x`
      are NaN).
    """

    x: Float[Array, " n"]
    result: RESULTS


def proximal_matching_loss(
    net: ProxNetwork,
    key_or_eps: PRNGKeyArray | Float[ArrayLike, " n"],
    x: Float[ArrayLike, " n"],
    t: Float[ArrayLike, ""] | float,
    lam: Float[ArrayLike, ""] | float,
    zeta: Float[ArrayLike, ""] | float,
) -> Float[Array, ""]:
    r"""One sample of ProxDM's proximal matching loss (Fang et al. 2025, Eq. 9).

    $\ell = 1 - \exp\bigl(-\lVert\hat\epsilon_\theta(x + \sqrt\lambda\,\epsilon;
    t, \lambda) - \epsilon\rVert^2 / (d\,\zeta^2)\bigr)$ with $x \sim p_t$,
    $\epsilon \sim N(0, I)$ and $d$ the dimension. As $\zeta \to 0$ its
    minimiser is the prox (a MAP denoiser), where the squared loss would
    give the posterior mean; shrink $\zeta$ during training.

    **Arguments:**

    - `net`: the proximal network.
    - `key_or_eps`: a PRNG key to draw $\epsilon$, or the noise itself.
    - `x`: one sample of the noised data $p_t$, shape `(n,)`.
    - `t`: its scalar diffusion time.
    - `lam`: the prox strength $\lambda \ge 0$.
    - `zeta`: the loss's width $\zeta > 0$.

    **Returns:**

    The scalar loss, in `[0, 1)`.
    """
    x = as_state("x", x)
    if is_key(key_or_eps):
        eps = jax.random.normal(key_or_eps, x.shape, x.dtype)
    else:
        eps = as_state_like("eps", key_or_eps, "x", x).astype(x.dtype)
    lam = _as_lam(lam, x.dtype)
    zeta = check_value(
        zeta,
        lambda xp, v: ~(v > 0) | ~xp.isfinite(v),
        "`zeta` must be positive and finite.",
    )
    zeta = jnp.asarray(zeta).astype(x.dtype)
    eps_hat = net.epsilon(x + jnp.sqrt(lam) * eps, t, lam)
    return 1 - jnp.exp(-jnp.sum((eps_hat - eps) ** 2) / (x.size * zeta**2))


class ProxSolution(eqx.Module):
    """The result of [`retrax.diffusion.prox_infer`][].

    **Arguments:**

    - `z`: the answer $w$: exact on hard clamps, full length.
    - `u`: the prior's proximal point at the answer, $\\mathrm{prox}(w)$.
    - `residual`: the fixed-point residual $T(w) - w$, full length (0 on
      hard clamps).
    - `steps`: the number of iterations taken.
    - `converged`: whether the iteration met its tolerance and the prox at
      the answer is a proximal point.
    - `result`: a [`retrax.diffusion.RESULTS`][] code: optimistix's result of
      the iteration, or the prox's own failure at the answer (see
      [`retrax.diffusion.AbstractProximalPredictor.prox_result`][]).
    """

    z: Float[Array, " n"]
    u: Float[Array, " n"]
    residual: Float[Array, " n"]
    steps: Int[Array, ""]
    converged: Bool[Array, ""]
    result: RESULTS


def _hqs_step(w, args):
    prox, z0, rho, hard, t, lam = args
    # The prox's own failures are checked at the answer (`prox_infer`); its
    # derivatives here are the map's, so that the adjoint's operator is finite.
    u, _ = prox.prox_result(w, t, lam)
    stiff = lam * rho**2
    return jnp.where(hard, z0, (u + stiff * z0) / (1 + stiff))


@eqx.filter_jit
def prox_infer(
    prox: AbstractProximalPredictor,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    t: Float[ArrayLike, ""] | float,
    lam: Float[ArrayLike, ""] | float = 0.01,
    *,
    z_init: Float[ArrayLike, " n"] | None = None,
    tol: float | None = None,
    max_steps: int = 10_000,
    throw: bool = True,
) -> ProxSolution:
    r"""Clamped inference with a proximal prior, by half-quadratic splitting.

    Finds a stationary point of
    $-\log p_t(u) + \tfrac1{2\lambda}\lVert u - w\rVert^2 +
    \tfrac12\sum_i\rho_i^2(w_i - z_{0,i})^2$ by the fixed-point iteration
    $w \leftarrow T(w)$:
    $u = \mathrm{prox}_{-\lambda\log p_t}(w)$, then
    $w_i = (u_i + \lambda\rho_i^2 z_{0,i})/(1 + \lambda\rho_i^2)$, and
    $w_i = z_{0,i}$ where $\rho_i = \infty$ (the plug-and-play / DiffPIR
    splitting; as $\lambda \to 0$ it tends to the clamped mode of $p_t$).
    Clamps follow the relation queries: $\rho_i = \infty$ is a hard clamp
    (exact), finite positive a soft target with standard deviation
    $1/\rho_i$, and 0 leaves the coordinate free (its `z0` is then only the
    start).

    The iteration is `optx.fixed_point` with `optx.FixedPointIteration`, and
    derivatives with respect to `z0`, `rho`, `t`, `lam` and the prior's
    parameters come from `optx.ImplicitAdjoint` (one linear solve with
    $I - \partial T/\partial w$), never through the loop. The derivative
    with respect to an infinite `rho` is 0.

    **Arguments:**

    - `prox`: the prior's proximal operator.
    - `z0`: the clamped values and soft targets, shape `(n,)`; finite where
      `rho > 0` (and everywhere when `z_init` is not given).
    - `rho`: the stiffnesses, shape `(n,)`, in `[0, inf]`.
    - `t`: the prior's diffusion time in `[0, 1]`.
    - `lam`: the splitting strength $\lambda > 0$.
    - `z_init`: the start, shape `(n,)`; `z0` by default. Its hard-clamped
      entries are ignored.
    - `tol`: the relative and absolute tolerance on the change of $w$ per
      step; `None` means 1e-9 in float64 and 1e-5 in float32. The iteration
      contracts linearly, so the error is about `tol` divided by one minus
      its rate.
    - `max_steps`: the most iterations.
    - `throw`: raise if the iteration does not converge, or if the prox at
      the answer failed (see
      [`retrax.diffusion.AbstractProximalPredictor.prox_result`][]). With
      `throw=False` a failed solve returns its last iterate and its result
      code, and every derivative of `z`, `u` and `residual` is NaN (forward
      and reverse mode), never a silent number.

    **Returns:**

    A [`retrax.diffusion.ProxSolution`][].
    """
    z0 = as_state("z0", z0)
    if z0.ndim != 1:
        raise ValueError(
            f"`z0` must be one query as a vector of shape (n,), got {z0.shape}. "
            "Batch several with `jax.vmap`."
        )
    rho = as_state_like("rho", rho, "z0", z0)
    dtype = z0.dtype
    rho = rho.astype(dtype)
    rho = error_if(
        rho, jnp.isnan(rho) | (rho < 0), "`rho` must lie in [0, inf] (no NaN)."
    )
    lam = _as_lam(lam, dtype, positive=True)
    t = time_like(t, z0)
    check_positive_int("max_steps", max_steps)
    if tol is None:
        tol = 1e-9 if dtype == jnp.float64 else 1e-5
    tol = check_value(tol, lambda xp, v: ~(v > 0), "`tol` must be positive.")
    hard = jnp.isinf(rho)
    used = rho > 0
    z0 = error_if(z0, used & ~jnp.isfinite(z0), "`z0` must be finite where `rho` > 0.")
    z0 = jnp.where(used, z0, 0.0) if z_init is not None else z0
    rho_soft = jnp.where(hard, 0.0, rho)
    if z_init is None:
        start = z0
    else:
        start = as_state_like("z_init", z_init, "z0", z0).astype(dtype)
    start = jnp.where(hard, z0, start)
    start = error_if(
        start,
        ~jnp.all(jnp.isfinite(start)),
        "the start (`z_init`, or `z0` at free coordinates) must be finite.",
    )
    args = (prox, jnp.where(used, z0, 0.0), rho_soft, hard, t, lam)
    sol = optx.fixed_point(
        _hqs_step,
        optx.FixedPointIteration(rtol=tol, atol=tol, norm=_max_norm),
        start,
        args,
        max_steps=max_steps,
        adjoint=optx.ImplicitAdjoint(),
        throw=False,
    )
    _, prox_result = prox.prox_result(jax.lax.stop_gradient(sol.value), t, lam)
    result = RESULTS.where(
        sol.result == optx.RESULTS.successful,
        prox_result,
        RESULTS.promote(sol.result),
    )
    converged = result == RESULTS.successful
    z = never_silent(sol.value, (prox, z0, rho_soft, t, lam), converged)
    u, _ = prox.prox_result(z, t, lam)
    residual = _hqs_step(z, args) - z
    out = ProxSolution(
        z=z,
        u=u,
        residual=residual,
        steps=jnp.asarray(sol.stats["num_steps"]),
        converged=converged,
        result=result,
    )
    if throw:
        out = result.error_if(out, ~converged)
    return out
