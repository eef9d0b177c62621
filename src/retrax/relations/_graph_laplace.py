r"""The Laplace approximation of a factor graph at its MAP point: per-variable
Gaussian beliefs and the graph's free energy."""

import math

import jax.numpy as jnp
from jaxtyping import Array, Float

from .._errors import filter_jit
from .._never_silent import nan_unless
from ._graph import FactorGraph
from ._graph_selected_inverse import (
    banded_logdet,
    banded_marginals,
    dense_logdet,
    dense_marginals,
)
from ._graph_solve import GraphSolution


# the rows of the graph's assembly each curvature reads
_CURVATURE_ROWS = {"hessian": "belief", "gauss_newton": "precision"}


def _check(graph, sol):
    if not isinstance(graph, FactorGraph):
        raise TypeError(f"`graph` must be a FactorGraph, got {type(graph).__name__}.")
    if not isinstance(sol, GraphSolution):
        raise TypeError(
            f"`sol` must be a GraphSolution (from solve_graph), got "
            f"{type(sol).__name__}."
        )
    if sol.x.shape != (graph.size,):
        raise ValueError(
            f"`sol` has {sol.x.shape[-1]} coordinates, but the graph has "
            f"{graph.size}: it was solved on another graph."
        )
    # The solution's variables (names and shapes) must be the graph's: a
    # structural check, free at trace time (a dict's order is lost in JAX's
    # flattening, so compared sorted).
    expected = sorted(
        (name, (dim,) if single else (count, dim))
        for name, count, dim, single in graph.variables
    )
    value = sol.value if isinstance(sol.value, dict) else {}
    got = sorted((name, tuple(jnp.shape(v))) for name, v in value.items())
    if got != expected:
        raise ValueError(
            f"`sol` is the solution of another graph: its variables are {got} "
            f"(name, shape), `graph`'s are {expected}; pass the solution of "
            "`solve_graph(graph)`."
        )


@filter_jit
def graph_laplace(
    graph: FactorGraph, sol: GraphSolution, *, curvature: str = "hessian"
) -> dict[str, Array]:
    r"""Each variable's Laplace covariance at the graph's MAP point.

    The diagonal blocks of $\mathrm{sym}(J)^{-1}$, the inverse of the
    symmetric part of the graph's Jacobian at `sol.x` (the Hessian of the
    energy for Gaussian and residual factors): the exact marginal
    covariances of a linear-Gaussian graph. A learned relation's rows enter
    as its `belief_precision`: with the nodes' smoothing removed for an
    `ImplicitDiffusion` built with `deblur=True`. Computed from the Cholesky
    factorisation in the solve's own structure: for a banded graph, by
    selected inversion (block Cholesky forward, Takahashi's recurrence
    backward, one `lax.scan` each: linear in the number of variables, and a
    compiled program that does not grow with the graph); for a dense one, from
    the whole inverse. The belief means are `sol.value`.

    For [`retrax.relations.ResidualFactor`][] rows the precision is by
    default the energy's full Hessian, where GTSAM's `Marginals` take the
    Gauss–Newton precision $J_r^\top J_r$: the two differ by the residuals'
    curvature, of the order of the residuals' noise (about $10^{-3}$ relative
    or less on the Pose2 graphs of `benchmarks/bench_graph_laplace.py`, which
    times both). `curvature="gauss_newton"` takes GTSAM's.

    **Arguments:**

    - `graph`: the graph.
    - `sol`: its [`retrax.relations.GraphSolution`][].
    - `curvature`: `"hessian"` (the default: the Laplace approximation's
      Hessian of the energy, as above) or `"gauss_newton"`: each row's
      positive semidefinite local precision, $J_r^\top J_r$ for a
      `ResidualFactor` (the linearisation GTSAM's `Marginals` invert, and
      `solve_graph`'s Levenberg–Marquardt steps use), $A^\top P A$ for a
      `GaussianFactor` (the same as the Hessian) and the positive part of
      the belief precision for a `RelationFactor`.

    **Returns:**

    The covariances by variable name: `(dimension, dimension)` for a
    variable, `(count, dimension, dimension)` for a family. NaN unless `sol`
    converged to a stable point and the Laplace precision there is positive
    definite (its Cholesky factorisation exists).

    **Raises:**

    `ValueError` when `sol` is the solution of another graph (its variables'
    names or shapes differ from `graph`'s).
    """
    _check(graph, sol)
    rows = _CURVATURE_ROWS.get(curvature) if isinstance(curvature, str) else None
    if rows is None:
        raise ValueError(
            f"`curvature` must be 'hessian' or 'gauss_newton', got {curvature!r}."
        )
    lay = graph.layout
    if sol.linear_solver == "banded":
        bands = graph.banded_jacobian(sol.x, rows)
        covs, positive = banded_marginals(
            bands, graph.banded.padded, lay.var_start, lay.var_dim
        )
    else:
        matrix = graph.dense_jacobian(sol.x, rows)
        covs, positive = dense_marginals(matrix, lay.var_start, lay.var_dim)
    ok = sol.converged & sol.stable & positive
    return graph.by_variable(nan_unless(ok, covs))


@filter_jit
def graph_free_energy(graph: FactorGraph, sol: GraphSolution) -> Float[Array, ""]:
    r"""The graph's Laplace free energy, $-\log Z$ of its unnormalised density
    $e^{-E}$ under the Laplace approximation at the MAP point $x^*$:

    $$F = E(x^*) + \tfrac12\log\det\mathrm{sym}(J(x^*)) - \tfrac n2\log 2\pi.$$

    Exact for a linear-Gaussian graph. Differentiable with respect to the
    factors' parameters (through $x^*$ by the implicit function theorem), so
    it serves as a training loss (the negative log evidence of the graph's
    fixed values). It needs every factor's energy: a
    [`retrax.relations.RelationFactor`][] of a learned relation that is not
    conservative (an MLP noise predictor) has none, and raises a
    `TypeError` saying so; use a conservative relation (an
    `EnergyNetwork`), or the log-determinant alone from
    [`retrax.relations.graph_laplace`][]'s covariances.

    **Arguments:**

    - `graph`: the graph.
    - `sol`: its [`retrax.relations.GraphSolution`][].

    **Returns:**

    The free energy, a scalar; NaN unless `sol` converged to a stable point
    (the log-determinant is that of the symmetric part's Cholesky factor, in
    the solve's banded or dense structure).
    """
    _check(graph, sol)
    energy = graph.energy(sol.x)
    if sol.linear_solver == "banded":
        logdet, positive = banded_logdet(graph.banded_jacobian(sol.x))
    else:
        logdet, positive = dense_logdet(graph.dense_jacobian(sol.x))
    n = graph.size
    free = energy + 0.5 * logdet - 0.5 * n * math.log(2 * math.pi)
    ok = sol.converged & sol.stable & positive
    return nan_unless(ok, free.astype(sol.x.dtype))
