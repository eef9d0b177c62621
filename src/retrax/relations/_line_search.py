r"""The line search of Newton's iteration on a residual, shared by the
guarded root finder of queries (`GuardedNewton`) and the Newton solve of
factor graphs (`solve_graph(..., method="newton")`).

Both minimise the merit $\phi(y) = \tfrac12\lVert r(y)\rVert^2$ along a
Newton direction $d$ ($J d = -r$), whose directional derivative at
$\alpha = 0$ is $-\lVert r\rVert^2 = -2\phi(y)$: Armijo's sufficient
decrease is $\phi(y + \alpha d) \le (1 - 2c\alpha)\,\phi(y)$.
"""

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Bool, Float


# Armijo's constant c: the least fraction of the predicted decrease a step keeps.
ARMIJO = 1e-4


def backtrack(
    residual,
    y: Float[Array, " n"],
    direction: Float[Array, " n"],
    r0: Float[Array, " n"],
    max_halvings: int,
    active: Bool[Array, ""] | bool = True,
    whole: Bool[Array, ""] | bool = False,
) -> tuple[Float[Array, ""], Float[Array, " n"]]:
    r"""Armijo backtracking along `direction` from `y`, whose residual is `r0`.

    Tries $\alpha = 1, \tfrac12, \dots, 2^{-\text{max\_halvings}}$ (each trial
    one call of `residual`) until one decreases the merit enough; when none
    does, the last (smallest) is returned. The merit is measured in units of
    $\max|r_0|$: half the squared residual itself overflows for residuals
    beyond about $10^{19}$ in float32 (a target or a precision of $10^{30}$),
    and every trial would fail; the test is unchanged by the scale.

    `active` False skips the search ($\alpha = 1$, no evaluation: a step the
    caller caps instead); `whole` True takes the first trial whatever its
    merit (a step already within the tolerance).

    Returns $\alpha$ and the residual at $y + \alpha d$ (`r0` when no trial
    ran); the program holds one copy of `residual`.
    """
    dtype = y.dtype
    active, whole = jnp.asarray(active, bool), jnp.asarray(whole, bool)
    unit = jnp.max(jnp.abs(r0))
    unit = jnp.where(jnp.isfinite(unit) & (unit > 0), unit, jnp.ones_like(unit))

    def merit(r):
        r = r / unit
        return 0.5 * jnp.sum(r * r)

    phi0 = merit(r0)

    def keep_going(carry):
        k, alpha, phi, _ = carry
        enough = phi <= (1 - 2 * ARMIJO * alpha) * phi0
        untried = k == 0
        return active & (untried | (~enough & (k <= max_halvings) & ~whole))

    def trial(carry):
        k, alpha, _, _ = carry
        alpha = jnp.where(k == 0, alpha, 0.5 * alpha)
        r = residual(y + alpha * direction)
        return k + 1, alpha, merit(r), r

    one = jnp.ones((), dtype)
    untried = jnp.asarray(jnp.inf, phi0.dtype)
    _, alpha, _, r = lax.while_loop(
        keep_going, trial, (jnp.zeros((), jnp.int32), one, untried, r0)
    )
    return alpha, r
