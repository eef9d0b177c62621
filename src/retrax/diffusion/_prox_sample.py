"""ProxDM's sampler: backward (proximal) steps of the reverse SDE."""

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._deprecated import deprecated_property
from .._errors import error_if, filter_jit
from .._never_silent import never_silent
from .._solution import AbstractSolution, throw_if_failed
from .._validate import check_positive_int, check_value
from ._prox import AbstractProximalPredictor
from ._sample import _dtype
from ._solution import RESULTS
from ._state import as_state


@filter_jit
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
    out = ProxSample(
        value=x, result=result, stats={"num_steps": jnp.asarray(steps, jnp.int32)}
    )
    return throw_if_failed(out, throw)


class ProxSample(AbstractSolution):
    """The result of [`retrax.diffusion.proxdm_sample`][].

    **Attributes:**

    - `value`: the sample.
    - `result`: a [`retrax.diffusion.RESULTS`][] code: `successful`, or the
      first failure of a prox along the chain (then the derivatives of
      `value` are NaN).
    - `stats`: `{"num_steps": steps}`, the number of proximal steps taken
      (see [`retrax.diffusion.AbstractSolution`][]).

    `x` is a deprecated alias of `value`.
    """

    value: Float[Array, " n"]
    result: RESULTS
    stats: dict[str, Array]

    x = deprecated_property("ProxSample.x", ".value", lambda s: s.value)
