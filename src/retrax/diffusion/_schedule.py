"""Noise schedules: the variance-preserving SDE of Song et al. (2021)."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from .._errors import error_if
from .._validate import check_value


def as_time(t: Shaped[ArrayLike, "*shape"] | float) -> Float[Array, "*shape"]:
    """Convert `t` to a floating array and check that it lies in `[0, 1]`.

    Concrete values are checked eagerly (a `ValueError`); traced values under
    `jit` through `eqx.error_if`, with the same message.
    """
    t = jnp.asarray(t)
    if not jnp.issubdtype(t.dtype, jnp.floating):
        if jnp.issubdtype(t.dtype, jnp.complexfloating):
            raise TypeError(f"the time `t` must be real, got dtype {t.dtype}.")
        t = t.astype(jnp.result_type(float))
    msg = "the time `t` must lie in [0, 1] (diffusion time), got a value outside it."
    if isinstance(t, jax.core.Tracer):
        return error_if(t, ~((t >= 0) & (t <= 1)), msg)
    # numpy, not jnp: a concrete `t` closed over by a traced function (a loop
    # body, `custom_root`) is checked eagerly, not staged out
    value = np.asarray(t)
    if not bool(np.all((value >= 0) & (value <= 1))):
        raise ValueError(msg)
    return t


class AbstractNoiseSchedule(eqx.Module):
    r"""A variance-preserving noise schedule.

    The forward (noising) process is $x_t = \alpha_t x_0 + \sigma_t \epsilon$,
    $\epsilon \sim N(0, I)$, with $\alpha_t^2 + \sigma_t^2 = 1$, given by the
    integrated rate $B(t) = \int_0^t \beta(s)\, ds$:
    $\alpha_t = e^{-B/2}$, $\sigma_t = \sqrt{1 - e^{-B}}$. It is the marginal
    of the SDE $dx = -\tfrac12 \beta(t) x\, dt + \sqrt{\beta(t)}\, dw$
    (Song et al., "Score-based generative modeling through stochastic
    differential equations", ICLR 2021).

    Subclasses define the field `t_min` and the two formulas `_beta` and
    `_integrated_beta`, $\beta(t)$ and $B(t)$ at a floating time already
    checked to lie in `[0, 1]`; every public method checks its `t` once (see
    `as_time`) and computes from those two. The library's own callers, whose
    times were checked where they entered (a node's times when the nodes were
    built, a predictor's `t` by `time_like`), use the unchecked `_alpha`,
    `_sigma` and `_sigma2`, so that a traced program stages one time check per
    public call rather than one per schedule evaluation.
    """

    t_min: eqx.AbstractVar[float]

    @abc.abstractmethod
    def _beta(self, t: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        r"""$\beta(t)$ at a floating time `t` already checked to lie in `[0, 1]`."""

    @abc.abstractmethod
    def _integrated_beta(self, t: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        r"""$B(t)$ at a floating time `t` already checked to lie in `[0, 1]`."""

    def _alpha(self, t: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """`alpha` at a checked time."""
        return jnp.exp(-0.5 * self._integrated_beta(t))

    def _sigma2(self, t: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        r"""$\sigma_t^2 = -\mathrm{expm1}(-B(t))$ at a checked time."""
        return -jnp.expm1(-self._integrated_beta(t))

    def _sigma(self, t: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        """`sigma` at a checked time."""
        return jnp.sqrt(self._sigma2(t))

    def beta(self, t: Float[ArrayLike, "*shape"] | float) -> Float[Array, "*shape"]:
        r"""The noise rate $\beta(t)$.

        **Arguments:**

        - `t`: diffusion time(s) in `[0, 1]`.

        **Returns:**

        $\beta(t)$, shaped and typed like `t`.
        """
        return self._beta(as_time(t))

    def integrated_beta(
        self, t: Float[ArrayLike, "*shape"] | float
    ) -> Float[Array, "*shape"]:
        r"""The integrated rate $B(t) = \int_0^t \beta(s)\, ds$.

        **Arguments:**

        - `t`: diffusion time(s) in `[0, 1]`.

        **Returns:**

        $B(t)$, shaped and typed like `t`.
        """
        return self._integrated_beta(as_time(t))

    def alpha(self, t: Float[ArrayLike, "*shape"] | float) -> Float[Array, "*shape"]:
        r"""The signal scale $\alpha_t = e^{-B(t)/2}$.

        **Arguments:**

        - `t`: diffusion time(s) in `[0, 1]`.

        **Returns:**

        $\alpha_t$, shaped and typed like `t`.
        """
        return self._alpha(as_time(t))

    def sigma(self, t: Float[ArrayLike, "*shape"] | float) -> Float[Array, "*shape"]:
        r"""The noise scale $\sigma_t = \sqrt{-\mathrm{expm1}(-B(t))}$.

        Computed through `expm1`, so it keeps full relative accuracy as
        $t \to 0$ where $1 - e^{-B}$ would cancel.

        **Arguments:**

        - `t`: diffusion time(s) in `[0, 1]`.

        **Returns:**

        $\sigma_t$, shaped and typed like `t`.
        """
        return self._sigma(as_time(t))

    def snr(self, t: Float[ArrayLike, "*shape"] | float) -> Float[Array, "*shape"]:
        r"""The signal-to-noise ratio $\alpha_t / \sigma_t$ (not squared).

        **Arguments:**

        - `t`: diffusion time(s) in `[0, 1]`.

        **Returns:**

        $\alpha_t / \sigma_t$, shaped like `t` (infinite at `t = 0`).
        """
        t = as_time(t)
        return self._alpha(t) / self._sigma(t)

    def drift(
        self, x: Float[ArrayLike, "*dims"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, "*dims"]:
        r"""The forward SDE drift $f(x, t) = -\tfrac12 \beta(t)\, x$.

        **Arguments:**

        - `x`: the state.
        - `t`: a scalar diffusion time in `[0, 1]`.

        **Returns:**

        $f(x, t)$, shaped and typed like `x`.
        """
        x = jnp.asarray(x)
        return (-0.5 * self._beta(as_time(t))).astype(x.dtype) * x

    def diffusion(
        self, t: Float[ArrayLike, "*shape"] | float
    ) -> Float[Array, "*shape"]:
        r"""The forward SDE diffusion coefficient $g(t) = \sqrt{\beta(t)}$.

        **Arguments:**

        - `t`: diffusion time(s) in `[0, 1]`.

        **Returns:**

        $g(t)$, shaped and typed like `t`.
        """
        return jnp.sqrt(self._beta(as_time(t)))

    def perturb(
        self,
        x0: Float[ArrayLike, "*dims"],
        t: Float[ArrayLike, ""] | float,
        eps: Float[ArrayLike, "..."],
    ) -> Float[Array, "*dims"]:
        r"""Noise clean data: $x_t = \alpha_t x_0 + \sigma_t \epsilon$.

        **Arguments:**

        - `x0`: clean data.
        - `t`: a scalar diffusion time in `[0, 1]`.
        - `eps`: the standard normal noise, shaped like `x0`.

        **Returns:**

        $x_t$, shaped and typed like `x0`.
        """
        x0 = jnp.asarray(x0)
        eps = jnp.asarray(eps)
        if x0.shape != eps.shape:
            raise ValueError(
                f"`eps` must have the shape of `x0`: got {eps.shape} and {x0.shape}."
            )
        dtype = x0.dtype
        t = as_time(t)
        return self._alpha(t).astype(dtype) * x0 + self._sigma(t).astype(
            dtype
        ) * eps.astype(dtype)

    def sample_time(
        self,
        key: PRNGKeyArray,
        shape: tuple[int, ...] = (),
        dtype: DTypeLike | None = None,
    ) -> Float[Array, "*shape"]:
        """Draw diffusion times uniformly on `[t_min, 1]`.

        **Arguments:**

        - `key`: a PRNG key.
        - `shape`: the shape of the draw; a scalar by default.
        - `dtype`: a floating dtype; JAX's default float by default.

        **Returns:**

        Uniform times of the given shape.
        """
        dtype = jnp.result_type(float) if dtype is None else dtype
        return jax.random.uniform(
            key, shape, dtype=dtype, minval=self.t_min, maxval=1.0
        )

    def marginal_variance(
        self,
        t: Float[ArrayLike, "*shape"] | float,
        v0: Float[ArrayLike, "*shape"] | float,
    ) -> Float[Array, "*shape"]:
        r"""The variance of $x_t$ when $x_0$ has variance `v0`:
        $\alpha_t^2 v_0 + \sigma_t^2$.

        **Arguments:**

        - `t`: diffusion time(s) in `[0, 1]`.
        - `v0`: the data variance (per coordinate).

        **Returns:**

        $\alpha_t^2 v_0 + \sigma_t^2$.
        """
        t = as_time(t)
        alpha = self._alpha(t)
        v0 = jnp.asarray(v0).astype(alpha.dtype)
        return alpha**2 * v0 + self._sigma(t) ** 2


class VPSDE(AbstractNoiseSchedule):
    r"""The variance-preserving SDE with a linear rate.

    $\beta(t) = \beta_{\min} + t(\beta_{\max} - \beta_{\min})$, so
    $B(t) = \beta_{\min} t + (\beta_{\max} - \beta_{\min}) t^2 / 2$
    (Song et al., ICLR 2021; the continuous limit of DDPM's linear schedule).

    **Arguments:**

    - `beta_min`: the rate at `t = 0`, positive.
    - `beta_max`: the rate at `t = 1`, at least `beta_min`.
    - `t_min`: the smallest time used for training and sampling, in `[0, 1)`.
    """

    beta_min: float | Float[Array, ""]
    beta_max: float | Float[Array, ""]
    t_min: float | Float[Array, ""]

    def __init__(
        self,
        beta_min: float | Float[ArrayLike, ""] = 0.1,
        beta_max: float | Float[ArrayLike, ""] = 20.0,
        t_min: float | Float[ArrayLike, ""] = 1e-3,
    ):
        # Python numbers are checked here; traced ones (a schedule built under
        # `jit`, `vmap` or `grad`) when the program runs, with the same messages.
        self.beta_min = check_value(
            beta_min,
            lambda xp, v: ~(v > 0) | ~xp.isfinite(v),
            "`beta_min` must be positive and finite.",
        )
        self.beta_max = check_value(
            beta_max,
            lambda xp, v: ~(v >= self.beta_min) | ~xp.isfinite(v),
            "`beta_max` must be finite and at least `beta_min`.",
        )
        self.t_min = check_value(
            t_min, lambda xp, v: ~((v >= 0) & (v < 1)), "`t_min` must lie in [0, 1)."
        )

    def _beta(self, t: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        return self.beta_min + t * (self.beta_max - self.beta_min)

    def _integrated_beta(self, t: Float[Array, "*shape"]) -> Float[Array, "*shape"]:
        return t * (self.beta_min + 0.5 * t * (self.beta_max - self.beta_min))
