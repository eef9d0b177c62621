"""Proximal diffusion models (ProxDM): proximal operators of -log p_t as priors."""

import abc
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._validate import check_value
from ._schedule import AbstractNoiseSchedule
from ._solution import RESULTS
from ._state import as_state, as_state_like, is_key, time_like


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
