"""Noise predictors: the epsilon-parametrisation of a denoiser and its derivatives."""

import abc
from collections.abc import Callable
from typing import Any, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree

from ._schedule import AbstractNoiseSchedule
from ._state import as_state, as_state_like, is_key, time_like


class AbstractPredictor(eqx.Module):
    r"""A noise predictor $\hat\epsilon(x_t, t)$ for a variance-preserving schedule.

    It estimates the noise in $x_t = \alpha_t x_0 + \sigma_t \epsilon$; the
    score and the posterior mean of $x_0$ follow from it. Works on one example
    (any shape); batch with `jax.vmap`.

    Subclasses define `epsilon`, the field `schedule`, and whether the
    predicted noise is the gradient of a known potential (`conservative` and
    `potential`), so that a relation built on it knows whether its field is a
    gradient without asking which predictor it holds.
    """

    schedule: eqx.AbstractVar[AbstractNoiseSchedule]

    @property
    @abc.abstractmethod
    def conservative(self) -> bool:
        r"""Whether $\hat\epsilon = \sigma_t\nabla_x E_t$ for the known potential
        `potential` (a closed-form density or an energy network)."""

    @abc.abstractmethod
    def potential(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, ""]:
        r"""The potential $E_t(x)$ with $\hat\epsilon = \sigma_t\nabla_x E_t$.

        $-\log p_t$ for a closed-form density, the network's energy for an
        energy network (both up to a constant). Predictors that are not
        `conservative` raise `TypeError`.

        **Arguments:**

        - `x`: one noisy example, a vector of length `n`.
        - `t`: its scalar diffusion time.

        **Returns:**

        The scalar potential.
        """

    @abc.abstractmethod
    def epsilon(
        self, x: Float[ArrayLike, "*dims"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, "*dims"]:
        r"""The predicted noise $\hat\epsilon(x, t)$.

        **Arguments:**

        - `x`: one noisy example $x_t$.
        - `t`: its scalar diffusion time in `[0, 1]`.

        **Returns:**

        $\hat\epsilon(x, t)$, shaped and typed like `x`.
        """

    def score(
        self, x: Float[ArrayLike, "*dims"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, "*dims"]:
        r"""The score $\nabla_x \log p_t(x) = -\hat\epsilon(x, t) / \sigma_t$.

        **Arguments:**

        - `x`: one noisy example.
        - `t`: its scalar diffusion time in `(0, 1]`.

        **Returns:**

        The score, shaped and typed like `x`.
        """
        x = as_state("x", x)
        t = time_like(t, x)
        return -self.epsilon(x, t) / self.schedule._sigma(t)

    def denoise(
        self, x: Float[ArrayLike, "*dims"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, "*dims"]:
        r"""Tweedie's posterior mean of the clean data.

        $E[x_0 | x_t] = (x - \sigma_t \hat\epsilon)/\alpha_t$.

        **Arguments:**

        - `x`: one noisy example.
        - `t`: its scalar diffusion time in `[0, 1]`.

        **Returns:**

        The denoised estimate, shaped and typed like `x`.
        """
        x = as_state("x", x)
        t = time_like(t, x)
        sched = self.schedule
        return (x - sched._sigma(t) * self.epsilon(x, t)) / sched._alpha(t)

    def denoising_loss(
        self,
        key_or_eps: PRNGKeyArray | Float[ArrayLike, "*dims"],
        x0: Float[ArrayLike, "*dims"],
        t: Float[ArrayLike, ""] | float,
    ) -> Float[Array, ""]:
        r"""The denoising score-matching loss of one example.

        $\tfrac1n \lVert \hat\epsilon(\alpha_t x_0 + \sigma_t \epsilon, t)
        - \epsilon \rVert^2$, the mean over the $n$ coordinates (Ho et al.,
        "Denoising diffusion probabilistic models", 2020, the simple loss).

        **Arguments:**

        - `key_or_eps`: a PRNG key to draw $\epsilon \sim N(0, I)$, or the
          noise itself (shaped like `x0`).
        - `x0`: one clean example.
        - `t`: its scalar diffusion time in `[0, 1]`.

        **Returns:**

        The scalar loss.
        """
        x0 = as_state("x0", x0)
        t = time_like(t, x0)
        if is_key(key_or_eps):
            eps = jax.random.normal(key_or_eps, x0.shape, x0.dtype)
        else:
            eps = as_state("eps", key_or_eps).astype(x0.dtype)
        xt = self.schedule.perturb(x0, t, eps)
        return jnp.mean((self.epsilon(xt, t) - eps) ** 2)


def default_input(
    x: Float[Array, "*dims"], t: Float[Array, ""]
) -> tuple[Float[Array, "*dims"], Float[Array, ""]]:
    """The identity adapter: the model receives `(x, t)` unchanged.

    **Arguments:**

    - `x`: one noisy example.
    - `t`: its scalar diffusion time.

    **Returns:**

    The pair `(x, t)`.
    """
    return x, t


class NoisePredictor(AbstractPredictor):
    r"""A learned noise predictor.

    $\hat\epsilon(x, t) = \mathrm{model}(\mathrm{input}(x, t))$.

    The predictor never looks inside the model: `input(x, t)` returns the
    pair of arguments the model is called with (identity by default; use it
    to rescale coordinates or map `t` to another clock), and the model must
    return an array shaped like `x`.

    **Arguments:**

    - `model`: a callable module `model(x_in, t_in) -> eps`, e.g.
      [`retrax.diffusion.TimeMLP`][].
    - `schedule`: the noise schedule it was (or will be) trained for.
    - `input`: the adapter `input(x, t) -> (x_in, t_in)`.
    """

    model: Callable[..., Array]
    schedule: AbstractNoiseSchedule
    input: Callable[[Array, Array], tuple[Any, Any]] = default_input

    def epsilon(
        self, x: Float[ArrayLike, "*dims"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, "*dims"]:
        x = as_state("x", x)
        t = time_like(t, x)
        out = self.model(*self.input(x, t))
        if not (hasattr(out, "shape") and out.shape == x.shape):
            raise ValueError(
                f"the model's output must have the shape of its input `x` "
                f"{x.shape} (it predicts the noise in `x`), got "
                f"{getattr(out, 'shape', type(out))}. Check the model's output size."
            )
        return out.astype(x.dtype)

    @property
    def conservative(self) -> bool:
        """False: a learned noise field is not a gradient in general."""
        return False

    def potential(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, ""]:
        """Not defined: a `NoisePredictor` has no known potential (raises)."""
        raise TypeError(
            "a NoisePredictor has no known potential; use an EnergyNetwork (or a "
            "GaussianMixtureEps) for a conservative field."
        )


class AbstractExactPredictor(AbstractPredictor):
    """A noise predictor that supplies its own exact Jacobian.

    A closed form ([`retrax.diffusion.GaussianMixtureEps`][]) or a structured
    derivative (the symmetric Hessian of [`retrax.diffusion.EnergyNetwork`][]);
    [`retrax.diffusion.epsilon_jacobian`][] uses `jacobian` for
    `mode="auto"` or `mode="exact"`.
    """

    @abc.abstractmethod
    def jacobian(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, "n n"]:
        r"""The exact Jacobian $\partial \hat\epsilon / \partial x$.

        **Arguments:**

        - `x`: one noisy example, a vector of length `n`.
        - `t`: its scalar diffusion time.

        **Returns:**

        The `(n, n)` Jacobian.
        """


def epsilon_jacobian(
    pred: AbstractPredictor,
    x: Float[ArrayLike, " n"],
    t: Float[ArrayLike, ""] | float,
    *,
    mode: Literal["auto", "fwd", "rev", "fd", "exact"] = "auto",
    fd_step: float | None = None,
) -> Float[Array, "n n"]:
    r"""The Jacobian $\partial \hat\epsilon(x, t) / \partial x$ of a predictor.

    **Arguments:**

    - `pred`: the noise predictor.
    - `x`: one noisy example, a vector of length `n`.
    - `t`: its scalar diffusion time.
    - `mode`: `"fwd"` (`jax.jacfwd`, n forward passes: best for the small
      `n` of a factor), `"rev"` (`jax.jacrev`), `"fd"` (central finite
      differences, for models that cannot be differentiated; not exact),
      `"exact"` (the predictor's own `jacobian`, for an
      [`retrax.diffusion.AbstractExactPredictor`][]), or `"auto"` (that one
      when available, otherwise forward mode).
    - `fd_step`: the finite-difference step for `mode="fd"`; by default
      `eps_machine^(1/3) * max(1, |x|_inf)`.

    **Returns:**

    The `(n, n)` Jacobian, row `i` the derivative of $\hat\epsilon_i$.
    """
    x = as_state("x", x)
    if x.ndim != 1:
        raise ValueError(
            f"`x` must be one example as a vector of shape (n,), got shape {x.shape}."
        )
    t = time_like(t, x)
    exact = isinstance(pred, AbstractExactPredictor)
    if mode == "auto":
        mode = "exact" if exact else "fwd"
    if mode == "exact":
        if not exact:
            raise ValueError(
                f"{type(pred).__name__} has no exact Jacobian of its own; use "
                "mode='fwd', 'rev' or 'fd'."
            )
        return pred.jacobian(x, t)
    if mode == "fwd":
        return jax.jacfwd(pred.epsilon)(x, t)
    if mode == "rev":
        return jax.jacrev(pred.epsilon)(x, t)
    if mode == "fd":
        if fd_step is None:
            h = jnp.finfo(x.dtype).eps ** (1 / 3) * jnp.maximum(
                1.0, jnp.max(jnp.abs(x))
            ).astype(x.dtype)
        else:
            h = jnp.asarray(fd_step, x.dtype)
        basis = jnp.eye(x.shape[0], dtype=x.dtype) * h
        plus = jax.vmap(lambda e: pred.epsilon(x + e, t))(basis)
        minus = jax.vmap(lambda e: pred.epsilon(x - e, t))(basis)
        return ((plus - minus) / (2 * h)).T
    raise ValueError(
        f"`mode` must be one of 'auto', 'fwd', 'rev', 'fd', 'exact'; got {mode!r}."
    )


def epsilon_vjp_params(
    pred: AbstractPredictor,
    x: Float[ArrayLike, "*dims"],
    t: Float[ArrayLike, ""] | float,
    w: Float[ArrayLike, "..."],
) -> PyTree:
    r"""The parameter cotangent $w^\top \partial \hat\epsilon(x, t) / \partial\theta$.

    The parameters $\theta$ are all floating-point arrays in `pred` (the
    network's weights for a [`retrax.diffusion.NoisePredictor`][], the means,
    scales and weights of a mixture), the same leaves `eqx.filter_grad`
    differentiates.

    **Arguments:**

    - `pred`: the noise predictor.
    - `x`: one noisy example.
    - `t`: its scalar diffusion time.
    - `w`: the output cotangent, shaped like `x`.

    **Returns:**

    A pytree shaped like `pred`, holding the cotangent at every floating-point
    array leaf and `None` elsewhere (for a `NoisePredictor`, the model's
    part is its `.model`).
    """
    x = as_state("x", x)
    w = as_state_like("w", w, "x", x)
    t = time_like(t, x)
    params, static = eqx.partition(pred, eqx.is_inexact_array)

    def eps_of(p):
        return eqx.combine(p, static).epsilon(x, t)

    _, pullback = jax.vjp(eps_of, params)
    (grads,) = pullback(w.astype(x.dtype))
    return grads
