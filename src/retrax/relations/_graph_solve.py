r"""The joint solve of a factor graph: its MAP point as a stable root of the
graph's gradient, by Newton's method on the graph's sparse Jacobian, with
derivatives by the implicit function theorem."""

from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from .._deprecated import deprecated_property
from .._errors import filter_jit
from .._never_silent import never_silent
from .._solution import AbstractSolution, throw_if_failed
from .._validate import check_positive_int, check_tol
from ._graph import FactorGraph
from ._graph_system import LinearSolver, choose_solver, graph_system
from ._infer import default_tol
from ._solution import RESULTS


class GraphSolution(AbstractSolution):
    r"""The MAP point of a [`retrax.relations.FactorGraph`][], from
    [`retrax.relations.solve_graph`][].

    **Attributes:**

    - `value`: the answer, the variables' values by name (a variable
      `(dimension,)`, a family `(count, dimension)`); NaN unless the solve
      converged. `values` is its old name, deprecated (with a
      `DeprecationWarning`).
    - `x`: the same as one flat vector, `(n,)`.
    - `gradient`: the graph's gradient $\nabla E$ at `x` (about 0).
    - `converged`: whether the last Newton step was within the tolerance.
    - `stable`: whether the symmetric part of the last Jacobian the solve
      evaluated (at a point within about $\sqrt{\mathrm{tol}}$ of `x`: the
      last steps reuse it) is positive definite (a minimum of the energy, not
      a saddle).
    - `result`: a [`retrax.relations.RESULTS`][]: `successful`,
      `unstable_root` (converged to a saddle: an answer, reported, never
      raised), `max_steps_reached` or `nonfinite_iterate`.
    - `stats`: `{"num_steps": ..., "max_step": ...}`, the Newton iterations
      taken and the size of the last step.
    - `linear_solver`: `"dense"` or `"banded"`, the solve used.
    """

    value: dict[str, Array]
    x: Float[Array, " n"]
    gradient: Float[Array, " n"]
    converged: Bool[Array, ""]
    stable: Bool[Array, ""]
    result: RESULTS
    stats: dict[str, Array]
    linear_solver: str = eqx.field(static=True)

    values = deprecated_property("GraphSolution.values", ".value", lambda s: s.value)


def _newton(graph: FactorGraph, x0, tol, max_steps, kind, jacobian_dtype):
    r"""Newton's method on the gradient with a backtracking line search on
    $\tfrac12\lVert\nabla E\rVert^2$.

    Returns `(x, g, aux)`: the last iterate, the gradient there and `[steps,
    converged, last step size, stable]` (stable: the symmetric part of the
    last Jacobian is positive definite). The gradient at an accepted trial
    point is carried to the next step, so the factors' gradients are traced
    twice (before the loop and in the line search) and their Jacobians once:
    compile time grows with the number of traces of a learned field.

    Once a Newton step is within $\sqrt{\mathrm{tol}}$ (scaled like the
    tolerance), the next step keeps the last Jacobian and its factorisation
    (a chord step): its error against a Newton step is of the order of the
    distance between the two points times the step, below the tolerance's
    square, and the Jacobian of a learned relation costs several of its
    field's evaluations. The step that confirms convergence is then one
    solve with the stored factors and one evaluation of the gradient.
    """
    dtype = x0.dtype
    near_tol = jnp.sqrt(jnp.asarray(tol, dtype))

    def fresh(x):
        system = graph_system(graph, x, kind, jacobian_dtype)
        stable, _ = system.symmetric_logdet()
        return system, stable

    def cond(state):
        step, done = state[2], state[4]
        return (step < max_steps) & ~done

    def body(state):
        x, g, step, _, _, stable, last, system = state
        # at most one chord step in a row: a stalled chord gets a fresh Jacobian
        near = last <= near_tol * (1 + jnp.max(jnp.abs(x)))
        system, stable = jax.lax.cond(near, lambda: (system, stable), lambda: fresh(x))
        delta = -system.solve(g)
        size = jnp.max(jnp.abs(delta))
        finite = jnp.all(jnp.isfinite(delta))
        small = size <= tol * (1 + jnp.max(jnp.abs(x)))
        phi0 = 0.5 * jnp.sum(g * g)

        def search(carry):
            alpha = carry[0] * 0.5
            g_new = graph.gradient(x + alpha * delta)
            return alpha, 0.5 * jnp.sum(g_new * g_new), g_new

        def keep_halving(carry):
            alpha, phi, _ = carry
            accepted = phi <= (1 - 1e-4 * alpha) * phi0
            # a step within the tolerance is taken whole: one trial
            first = alpha == 1.0
            return (alpha > 2.0**-10) & ~accepted & ~(small & first)

        inf = jnp.asarray(jnp.inf, dtype)
        alpha, _, g_new = jax.lax.while_loop(
            keep_halving, search, (jnp.asarray(2.0, dtype), inf, g)
        )
        x_new = jnp.where(finite, x + alpha * delta, x)
        g_new = jnp.where(finite, g_new, g)
        stop = small | ~finite
        # a chord step follows only a whole step: a backtracked one says the
        # Jacobian's model is poor there
        taken = jnp.where(finite & (alpha == 1.0) & ~near, size, inf)
        size = jnp.where(finite, size, inf)
        return x_new, g_new, step + 1, size, stop, stable, taken, system

    false = jnp.array(False)
    inf = jnp.asarray(jnp.inf, dtype)
    shapes = eqx.filter_eval_shape(fresh, x0)
    placeholder = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    init = (
        x0,
        graph.gradient(x0),
        jnp.zeros((), jnp.int32),
        inf,
        false,
        placeholder[1],
        inf,
        placeholder[0],
    )
    x, g, steps, size, done, stable, _, _ = jax.lax.while_loop(cond, body, init)
    converged = done & jnp.isfinite(size)
    aux = jnp.stack(
        [steps.astype(dtype), converged.astype(dtype), size, stable.astype(dtype)]
    )
    return x, g, aux


@eqx.filter_custom_jvp
def _map_point(graph, x0, *, tol, max_steps, kind, jacobian_dtype):
    return _newton(graph, x0, tol, max_steps, kind, jacobian_dtype)


@_map_point.def_jvp
def _map_point_jvp(primals, tangents, *, tol, max_steps, kind, jacobian_dtype):
    graph, x0 = primals
    t_graph, _ = tangents
    x, g, aux = _map_point(
        graph,
        x0,
        tol=tol,
        max_steps=max_steps,
        kind=kind,
        jacobian_dtype=jacobian_dtype,
    )
    # at a root the gradient's tangent is 0 (that is the implicit function
    # theorem's equation), and the statistics have none
    zeros = (jnp.zeros_like(g), jnp.zeros_like(aux))
    if t_graph is None:
        return (x, g, aux), (jnp.zeros_like(x), *zeros)
    t_graph = jax.tree.map(
        lambda p, t: jnp.zeros_like(p) if t is None and eqx.is_inexact_array(p) else t,
        graph,
        t_graph,
        is_leaf=lambda v: v is None,
    )
    root = jax.lax.stop_gradient(x)
    _, rhs = eqx.filter_jvp(lambda g: g.gradient(root), (graph,), (t_graph,))
    constant = jax.tree.map(
        lambda v: jax.lax.stop_gradient(v) if eqx.is_array(v) else v, graph
    )
    system = graph_system(constant, root, kind)
    t_x = -system.solve(rhs)
    return (x, g, aux), (t_x, *zeros)


@filter_jit
def solve_graph(
    graph: FactorGraph,
    init: Mapping[str, Float[ArrayLike, "..."]] | None = None,
    *,
    tol: float | None = None,
    max_steps: int = 100,
    linear_solver: LinearSolver = "auto",
    dtype=None,
    jacobian_dtype=None,
    throw: bool = True,
) -> GraphSolution:
    r"""The graph's MAP point: a stable root of $\nabla E$, by Newton's method.

    Each step evaluates every factor's rows in one `vmap`-ed call (their
    gradients and local Jacobians), assembles the graph's Jacobian and
    solves for the Newton step, then backtracks on
    $\tfrac12\lVert\nabla E\rVert^2$. The Jacobian is block tridiagonal in
    a bandwidth-reducing order of the variables for chains and trees (a
    solve linear in the number of variables, `linear_solver="banded"`), or a
    dense matrix solved by LU through lineax (`"dense"`, any graph). On a
    graph of Gaussian and residual factors this is Newton's method on the
    nonlinear least-squares problem (exact on a linear-Gaussian graph: one
    step); with learned relations, on their fields.

    Derivatives of the answer with respect to every floating array of the
    graph (the factors' parameters, measurements, precisions, the relations'
    networks) come by the implicit function theorem: one linear solve with
    the Jacobian at the answer (its transpose in reverse mode), never a pass
    back through the iterations. `jax.grad`, `jax.jvp`, `jax.jit` and
    `jax.vmap` all apply. With `throw=False`, a solve that did not converge
    returns NaN values (and NaN derivatives) with its result code.

    **Arguments:**

    - `graph`: the [`retrax.relations.FactorGraph`][].
    - `init`: start values by variable name (others start at 0).
    - `tol`: the tolerance of the last step, $\max|\delta| \le
      \mathrm{tol}(1 + \max|x|)$: a positive finite float; `1e-9` in float64
      and `1e-5` in float32 by default.
    - `max_steps`: the most Newton steps, a positive integer.
    - `linear_solver`: `"auto"` (banded when the graph's order gives at least
      four blocks, else dense), `"dense"` or `"banded"`.
    - `dtype`: the solve's dtype; `init`'s floating dtype, or JAX's default
      float, by default.
    - `jacobian_dtype`: the dtype in which Newton's matrix is evaluated (the
      factors' floating arrays and the iterate cast to it); the solve's
      dtype by default. `jnp.float32` in a float64 solve of learned relations
      (networks trained in float32) about halves the cost of their Jacobians,
      the bulk of a step: the gradient, the convergence test and the answer
      stay in the solve's dtype, so the answer is the same root to the
      tolerance, reached by a quasi-Newton iteration (a linear-Gaussian
      graph then takes a few steps instead of one). The derivatives by the
      implicit function theorem always use the exact Jacobian in the solve's
      dtype.
    - `throw`: whether a solve that does not converge raises.

    **Returns:**

    A [`retrax.relations.GraphSolution`][].
    """
    if not isinstance(graph, FactorGraph):
        raise TypeError(f"`graph` must be a FactorGraph, got {type(graph).__name__}.")
    tol = check_tol(tol)
    check_positive_int("max_steps", max_steps)
    kind = choose_solver(graph, linear_solver)
    x0 = graph.flatten(init, dtype)
    dtype = x0.dtype
    if jacobian_dtype is not None:
        if not jnp.issubdtype(jacobian_dtype, jnp.floating):
            raise TypeError(
                "`jacobian_dtype` must be a real floating dtype, got "
                f"{jacobian_dtype!r}."
            )
        jacobian_dtype = jnp.dtype(jacobian_dtype)
        if jacobian_dtype == dtype:
            jacobian_dtype = None
    tol = default_tol(dtype) if tol is None else tol
    x, g, aux = _map_point(
        graph,
        x0,
        tol=tol,
        max_steps=max_steps,
        kind=kind,
        jacobian_dtype=jacobian_dtype,
    )
    aux = jax.lax.stop_gradient(aux)
    steps = aux[0].astype(jnp.int32)
    converged = aux[1] > 0
    size = aux[2]
    finite = jnp.isfinite(size)
    stable = (aux[3] > 0) & converged
    result = RESULTS.where(
        converged,
        RESULTS.where(stable, RESULTS.successful, RESULTS.unstable_root),
        RESULTS.where(finite, RESULTS.max_steps_reached, RESULTS.nonfinite_iterate),
    )
    x = never_silent(x, graph, converged)
    x = jnp.where(converged, x, jnp.asarray(jnp.nan, dtype))
    sol = GraphSolution(
        value=graph.unflatten(x),
        x=x,
        gradient=jnp.where(converged, g, jnp.asarray(jnp.nan, dtype)),
        converged=converged,
        stable=stable,
        result=result,
        stats={"num_steps": steps, "max_step": size},
        linear_solver=kind,
    )
    failed = ~converged
    return throw_if_failed(sol, throw, failed)
