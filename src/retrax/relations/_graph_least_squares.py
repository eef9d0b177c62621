r"""Gauss–Newton and Levenberg–Marquardt on a factor graph whose factors are
all residuals (`GaussianFactor`, `ResidualFactor`): the energy is
$E(x) = \tfrac12\sum_i \lVert r_i(x)\rVert^2$ (each $r_i$ whitened), its
gradient $g = \sum_i J_i^\top r_i$, and the step solves

$$(H + \lambda D)\,\delta = -g,\qquad H = \sum_i J_i^\top J_i,$$

with $H$ assembled row by row in the graph's dense or block-tridiagonal
layout (the same machinery as Newton's matrix) and $D$ Marquardt's diagonal
scaling, $\mathrm{diag}(H)$ floored at $10^{-6}\max\mathrm{diag}(H)$ so
that $\lambda$ is dimensionless. $\lambda$ follows the gain ratio
$\rho$ of the actual to the predicted decrease of $E$ (Nielsen's rule, as
in Madsen, Nielsen and Tingleff, *Methods for non-linear least squares
problems*, 2004, §3.2, and optimistix's and GTSAM's trust regions): a step
with $\rho > 10^{-4}$ is taken and $\lambda$ shrinks by
$\max(\tfrac13, 1 - (2\rho - 1)^3)$; a rejected one grows it by $\nu$,
which doubles at each rejection in a row.

$\lambda$ starts at 0: the first trial is a whole Gauss–Newton step, so a
linear-Gaussian graph is solved exactly in one step (the second only
confirms it), and $\lambda$ returns to 0 once it falls below $10^{-7}$.
With `damped=False` (Gauss–Newton) every finite step is taken whole.

The loop's state is a module with named fields; the linear solves go
through the systems of `_graph_system` (block Cholesky of $H$ in float64;
below it, QR of the whitened rows $[J \mid -r]$, whose step never forms $H$
or $g$: `gauss_newton_system`), whose result is carried in the state.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from ._graph import FactorGraph
from ._graph_system import (
    AbstractGraphSystem,
    gauss_newton_linearisation,
    gauss_newton_step,
    gauss_newton_system,
    square_root_wanted,
)
from ._solution import RESULTS


_ACCEPT = 1e-4  # the least gain ratio of a step that is taken
_FIRST_DAMPING = 1e-3  # lambda after a rejected undamped step
_NO_DAMPING = 1e-7  # below this lambda returns to 0 (Gauss-Newton)
_CONVERGED_DAMPING = 1.0  # a small step with more damping is not convergence


class LeastSquaresState(eqx.Module):
    """The state of the least-squares loop, at the last accepted point `x`."""

    x: Float[Array, " n"]
    cost: Float[Array, ""]
    stale: Bool[Array, ""]  # `gradient` and `system` are not yet at `x`
    gradient: Float[Array, " n"]
    system: AbstractGraphSystem  # the Gauss-Newton matrix, unfactorised
    trial: AbstractGraphSystem  # the last step's damped matrix, factorised
    trial_damping: Float[Array, ""]  # its lambda
    damping: Float[Array, ""]
    growth: Float[Array, ""]
    num_steps: Int[Array, ""]
    num_accepted: Int[Array, ""]
    last_step: Float[Array, ""]
    converged: Bool[Array, ""]
    linear_result: RESULTS


def _scaling(diag: Float[Array, " n"]) -> Float[Array, " n"]:
    """Marquardt's damping diagonal: `diag(H)` floored relative to its
    largest entry (1 where `H` is 0), so that no coordinate goes undamped."""
    top = jnp.max(jnp.abs(diag))
    top = jnp.where(top > 0, top, jnp.ones_like(top))
    return jnp.maximum(diag, 1e-6 * top)


def _linearise(graph: FactorGraph, x, kind, jacobian_dtype):
    """The gradient and the Gauss–Newton matrix at `x` (the matrix evaluated
    in `jacobian_dtype` when given, and not yet factorised): from one
    evaluation of the rows when both are in `x`'s dtype and the matrix is
    formed (float64)."""
    if jacobian_dtype is None and not square_root_wanted(x.dtype):
        return gauss_newton_linearisation(graph, x, kind)
    return graph.gradient(x), gauss_newton_system(graph, x, kind, jacobian_dtype)


def _next_damping(damping, growth, accept, ratio):
    """Nielsen's update of $(\\lambda, \\nu)$ after a trial step."""
    shrink = jnp.where(
        jnp.isfinite(ratio), jnp.maximum(1 / 3, 1 - (2 * ratio - 1) ** 3), 1 / 3
    )
    good = damping * shrink
    good = jnp.where(good < _NO_DAMPING, jnp.zeros_like(good), good)
    bad = jnp.maximum(damping * growth, _FIRST_DAMPING)
    new_damping = jnp.where(accept, good, bad)
    new_growth = jnp.where(accept, jnp.full_like(growth, 2), 2 * growth)
    return new_damping, new_growth


def _step(graph, state: LeastSquaresState, tol, kind, damped, jacobian_dtype):
    """One trial step: linearise at a new point, solve, evaluate, accept or
    reject. The factors are linearised in one place (traced once), at the
    start of the step after an accepted one."""
    g, system = jax.lax.cond(
        state.stale,
        lambda: _linearise(graph, state.x, kind, jacobian_dtype),
        lambda: (state.gradient, state.system),
    )
    x, lam = state.x, state.damping
    scale = _scaling(system.diagonal())
    # one factorisation a trial (lambda = 0 factorises H itself)
    trial = system.add_diagonal(lam * scale)
    delta, linear_result = gauss_newton_step(trial, g)
    finite = jnp.all(jnp.isfinite(delta))
    delta = jnp.where(finite, delta, jnp.zeros_like(delta))
    size = jnp.max(jnp.abs(delta))
    small = finite & (size <= tol * (1 + jnp.max(jnp.abs(x))))
    x_new = x + delta
    cost_new = graph.energy(x_new)
    if damped:
        predicted = 0.5 * (lam * jnp.sum(scale * delta * delta) - jnp.dot(g, delta))
        ratio = (state.cost - cost_new) / predicted
        decrease = (cost_new <= state.cost) & (ratio > _ACCEPT)
        # an infinite cost (an input near the dtype's limit) has no ratio:
        # any finite trial is progress
        accept = (
            finite
            & jnp.isfinite(cost_new)
            & (decrease | ~jnp.isfinite(state.cost) | small)
        )
        damping, growth = _next_damping(lam, state.growth, accept, ratio)
    else:
        accept = finite
        damping, growth = lam, state.growth
    return LeastSquaresState(
        x=jnp.where(accept, x_new, x),
        cost=jnp.where(accept, cost_new, state.cost),
        stale=accept,
        gradient=g,
        system=system,
        trial=trial,
        trial_damping=lam,
        damping=damping,
        growth=growth,
        num_steps=state.num_steps + 1,
        num_accepted=state.num_accepted + accept.astype(jnp.int32),
        last_step=jnp.where(finite, size, jnp.asarray(jnp.inf, size.dtype)),
        converged=accept & small & (lam <= _CONVERGED_DAMPING),
        linear_result=linear_result,
    )


def _healthy(state: LeastSquaresState) -> Bool[Array, ""]:
    """Whether the loop can go on: a finite gradient (the last one
    evaluated) and a cost that is not NaN (an infinite cost, an input near
    the dtype's limit, can still fall)."""
    return jnp.all(jnp.isfinite(state.gradient)) & ~jnp.isnan(state.cost)


def least_squares(
    graph: FactorGraph,
    x0: Float[Array, " n"],
    tol,
    max_steps,
    kind,
    damped: bool,
    jacobian_dtype=None,
) -> LeastSquaresState:
    """The least-squares loop from `x0`: Levenberg–Marquardt (`damped`) or
    Gauss–Newton, until a step within `tol` (scaled by `1 + max|x|`), a
    non-finite gradient or `max_steps` trial steps."""
    dtype = x0.dtype

    def zeros_like(tree):
        return jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), tree)

    # the first step linearises at x0: placeholders until then
    g, system = zeros_like(
        eqx.filter_eval_shape(_linearise, graph, x0, kind, jacobian_dtype)
    )
    trial = zeros_like(eqx.filter_eval_shape(lambda s: s.add_diagonal(g), system))
    init = LeastSquaresState(
        x=x0,
        cost=graph.energy(x0),
        stale=jnp.array(True),
        gradient=g,
        system=system,
        trial=trial,
        trial_damping=jnp.ones((), dtype),
        damping=jnp.zeros((), dtype),
        growth=jnp.full((), 2, dtype),
        num_steps=jnp.zeros((), jnp.int32),
        num_accepted=jnp.zeros((), jnp.int32),
        last_step=jnp.asarray(jnp.inf, dtype),
        converged=jnp.array(False),
        linear_result=RESULTS.successful,
    )

    def cond(state):
        return (state.num_steps < max_steps) & ~state.converged & _healthy(state)

    return jax.lax.while_loop(
        cond, lambda s: _step(graph, s, tol, kind, damped, jacobian_dtype), init
    )


def least_squares_result(state: LeastSquaresState) -> tuple[RESULTS, Array, Array]:
    """The loop's result code, whether the answer is a strict minimum (the
    Gauss–Newton matrix positive definite) and whether the state is finite.

    A converged loop whose Gauss–Newton matrix is singular (a variable that
    no factor determines, a zero precision) has no unique answer: `singular`,
    a failure, not a success."""
    # the last trial factorised the undamped matrix when its lambda was 0
    positive = jax.lax.cond(
        state.trial_damping == 0,
        lambda: state.trial.positive_definite(),
        lambda: state.system.positive_definite(),
    )
    finite = _healthy(state) & jnp.all(jnp.isfinite(state.x))
    result = RESULTS.where(
        state.converged,
        RESULTS.where(positive, RESULTS.successful, RESULTS.singular),
        RESULTS.where(finite, RESULTS.max_steps_reached, RESULTS.nonfinite_iterate),
    )
    return result, positive, finite
