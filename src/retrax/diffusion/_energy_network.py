"""Energy-parametrised noise predictors: a conservative noise field."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree

from ._predictor import AbstractExactPredictor
from ._schedule import AbstractNoiseSchedule
from ._state import as_state, is_key, time_like


class EnergyNetwork(AbstractExactPredictor):
    r"""A noise predictor that is the gradient of a learned energy.

    $\hat\epsilon(x, t) = \sigma_t \nabla_x E(x, t)$, so the predicted score
    $-\nabla_x E$ is a true gradient field (Salimans and Ho, "Should EBMs
    model the energy or the score?", 2021), $E \approx -\log p_t$ up to a
    constant, and the Jacobian $\sigma_t \nabla^2_x E$ is symmetric. Implicit
    inference on such a field has an energy, so its roots are minima of a
    potential.

    **Arguments:**

    - `net`: a callable module `net(x, t)` returning the scalar energy (shape
      `()` or `(1,)`), e.g. `TimeMLP(n, out_size=1, key=key)`.
    - `schedule`: the noise schedule.
    """

    net: Callable[..., Array]
    schedule: AbstractNoiseSchedule

    def energy(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, ""]:
        r"""The scalar energy $E(x, t)$.

        **Arguments:**

        - `x`: one point, shape `(n,)`.
        - `t`: its scalar diffusion time.

        **Returns:**

        The energy as a scalar.
        """
        x = as_state("x", x)
        t = time_like(t, x)
        out = self.net(x, t)
        if not (hasattr(out, "shape") and out.shape in ((), (1,))):
            raise ValueError(
                "the energy network must return a scalar (shape () or (1,)), got "
                f"{getattr(out, 'shape', type(out))}; e.g. "
                "`TimeMLP(n, out_size=1, key=key)`."
            )
        return jnp.reshape(out, ()).astype(x.dtype)

    @property
    def conservative(self) -> bool:
        r"""True: the predicted noise is $\sigma_t\nabla_x E$."""
        return True

    def potential(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, ""]:
        """The network's energy $E(x, t)$ (see `energy`)."""
        return self.energy(x, t)

    def epsilon(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, " n"]:
        x = as_state("x", x)
        t = time_like(t, x)
        return self.schedule._sigma(t) * jax.grad(self.energy)(x, t)

    def jacobian(
        self, x: Float[ArrayLike, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, "n n"]:
        r"""The Jacobian $\sigma_t \nabla_x^2 E(x, t)$, by forward-over-reverse AD.

        **Arguments:**

        - `x`: one point, shape `(n,)`.
        - `t`: its scalar diffusion time.

        **Returns:**

        The symmetric `(n, n)` Jacobian.
        """
        x = as_state("x", x)
        t = time_like(t, x)
        return self.schedule._sigma(t) * jax.hessian(self.energy)(x, t)

    def denoising_gradient(
        self,
        key_or_eps: PRNGKeyArray | Float[ArrayLike, "batch n"],
        x0: Float[ArrayLike, "batch n"],
        t: Float[ArrayLike, " batch"],
    ) -> tuple[Float[Array, ""], PyTree]:
        r"""The batch denoising loss and its gradient with respect to the energy.

        The loss is the mean over the batch of
        [`retrax.diffusion.AbstractPredictor.denoising_loss`][]; its gradient
        differentiates through $\nabla_x E$ (second-order AD).

        **Arguments:**

        - `key_or_eps`: a PRNG key for the noise, or the noise, shape
          `(batch, n)`.
        - `x0`: clean examples, shape `(batch, n)`.
        - `t`: their times, shape `(batch,)`.

        **Returns:**

        `(loss, grads)`, with `grads` shaped like this module (the network's
        part is `grads.net`).
        """
        x0 = as_state("x0", x0)
        t = jnp.asarray(t)
        if x0.ndim != 2 or t.shape != x0.shape[:1]:
            raise ValueError(
                "`x0` must have shape (batch, n) and `t` shape (batch,), got "
                f"{x0.shape} and {t.shape}."
            )
        keys = (
            jax.random.split(key_or_eps, x0.shape[0])
            if is_key(key_or_eps)
            else as_state("eps", key_or_eps)
        )

        def loss_fn(model):
            return jnp.mean(jax.vmap(model.denoising_loss)(keys, x0, t))

        return eqx.filter_value_and_grad(loss_fn)(self)
