r"""The Laplace approximation of a factor graph at its MAP point: per-variable
Gaussian beliefs and the graph's free energy."""

import math

from jaxtyping import Array, Float

from .._errors import filter_jit
from .._never_silent import nan_unless
from ._graph import FactorGraph
from ._graph_solve import GraphSolution
from ._graph_system import graph_system


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


@filter_jit
def graph_laplace(graph: FactorGraph, sol: GraphSolution) -> dict[str, Array]:
    r"""Each variable's Laplace covariance at the graph's MAP point.

    The diagonal blocks of $\mathrm{sym}(J)^{-1}$, the inverse of the
    symmetric part of the graph's Jacobian at `sol.x` (the Hessian of the
    energy for Gaussian and residual factors): the exact marginal
    covariances of a linear-Gaussian graph. A learned relation's rows enter
    as its `belief_precision`: with the nodes' smoothing removed for an
    `ImplicitDiffusion` built with `deblur=True`. Computed with the solve's own
    structure (for a banded graph, by a backward recursion over the blocks:
    linear in the number of variables). The belief means are `sol.value`.

    **Arguments:**

    - `graph`: the graph.
    - `sol`: its [`retrax.relations.GraphSolution`][].

    **Returns:**

    The covariances by variable name: `(dimension, dimension)` for a
    variable, `(count, dimension, dimension)` for a family. NaN unless `sol`
    converged to a stable point.
    """
    _check(graph, sol)
    system = graph_system(graph, sol.x, sol.linear_solver, rows="belief")
    covs = system.variable_covariances()
    return graph.by_variable(nan_unless(sol.converged & sol.stable, covs))


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

    The free energy, a scalar; NaN unless `sol` converged to a stable point.
    """
    _check(graph, sol)
    energy = graph.energy(sol.x)
    _, logdet = graph_system(graph, sol.x, sol.linear_solver).symmetric_logdet()
    n = graph.size
    free = energy + 0.5 * logdet - 0.5 * n * math.log(2 * math.pi)
    return nan_unless(sol.converged & sol.stable, free.astype(sol.x.dtype))
