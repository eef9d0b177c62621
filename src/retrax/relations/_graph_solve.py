r"""The joint solve of a factor graph: its MAP point as a stable root of the
graph's gradient, by Newton's method on the graph's sparse Jacobian, with
derivatives by the implicit function theorem."""

from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Int

from .._deprecated import deprecated_property
from .._errors import filter_jit
from .._never_silent import nan_derivatives_unless
from .._solution import AbstractSolution
from .._validate import check_positive_int, check_tol
from ._graph import FactorGraph
from ._graph_factor import GaussianFactor, ResidualFactor
from ._graph_least_squares import least_squares, least_squares_result
from ._graph_system import (
    AbstractGraphSystem,
    LinearSolver,
    choose_solver,
    graph_system,
)
from ._infer import default_tol
from ._line_search import backtrack
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
    - `converged`: whether the last step was within the tolerance (and, for
      the least-squares methods, the Gauss–Newton matrix there is positive
      definite: the answer is determined).
    - `stable`: whether the symmetric part of the last Jacobian the solve
      evaluated (at a point within the tolerance of `x`) is positive
      definite (a minimum of the energy, not a saddle); for the
      least-squares methods, the Gauss–Newton matrix's.
    - `result`: a [`retrax.relations.RESULTS`][]: `successful`,
      `unstable_root` (Newton only: converged to a saddle; an answer,
      reported, never raised), `singular` (the factors do not determine
      every variable), `max_steps_reached` or `nonfinite_iterate`.
    - `stats`: `num_steps` (the steps tried) and `max_step` (the size of the
      last one); for the least-squares methods also `num_accepted` (the
      steps taken), `cost` (the energy at the last point) and `damping`
      (the last Levenberg–Marquardt $\lambda$, dimensionless).
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


class _NewtonState(eqx.Module):
    """The state of Newton's loop on the graph's gradient."""

    x: Float[Array, " n"]
    gradient: Float[Array, " n"]
    num_steps: Int[Array, ""]
    last_step: Float[Array, ""]
    done: Bool[Array, ""]
    stable: Bool[Array, ""]
    chord_step: Float[Array, ""]
    system: AbstractGraphSystem


# the most halvings of a Newton step of the graph (the last trial 2**-10)
_HALVINGS = 10


def _newton_step(graph, state: _NewtonState, tol, kind, jacobian_dtype):
    r"""One Newton step with a backtracking line search on
    $\tfrac12\lVert\nabla E\rVert^2$ (see `_newton`)."""
    x, g = state.x, state.gradient
    dtype = x.dtype
    near_tol = jnp.sqrt(jnp.asarray(tol, dtype))

    def fresh():
        system = graph_system(graph, x, kind, jacobian_dtype)
        return system, system.symmetric_logdet()[0]

    # at most one chord step in a row: a stalled chord gets a fresh Jacobian
    near = state.chord_step <= near_tol * (1 + jnp.max(jnp.abs(x)))
    system, stable = jax.lax.cond(near, lambda: (state.system, state.stable), fresh)
    delta = -system.solve(g)
    size = jnp.max(jnp.abs(delta))
    finite = jnp.all(jnp.isfinite(delta))
    small = size <= tol * (1 + jnp.max(jnp.abs(x)))
    # Armijo backtracking on half the squared gradient; a step within the
    # tolerance is taken whole (one trial)
    alpha, g_new = backtrack(graph.gradient, x, delta, g, _HALVINGS, whole=small)
    inf = jnp.asarray(jnp.inf, dtype)
    return _NewtonState(
        x=jnp.where(finite, x + alpha * delta, x),
        gradient=jnp.where(finite, g_new, g),
        num_steps=state.num_steps + 1,
        last_step=jnp.where(finite, size, inf),
        done=small | ~finite,
        stable=stable,
        # a chord step follows only a whole step: a backtracked one says the
        # Jacobian's model is poor there
        chord_step=jnp.where(finite & (alpha == 1.0) & ~near, size, inf),
        system=system,
    )


def _newton(graph: FactorGraph, x0, tol, max_steps, kind, jacobian_dtype):
    r"""Newton's method on the gradient with a backtracking line search on
    $\tfrac12\lVert\nabla E\rVert^2$: the solve of graphs with learned
    relations, whose fields need not be the gradient of an energy.

    Returns the last `_NewtonState`. The gradient at an accepted trial
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
    inf = jnp.asarray(jnp.inf, dtype)
    shapes = eqx.filter_eval_shape(
        lambda x: graph_system(graph, x, kind, jacobian_dtype), x0
    )
    placeholder = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    init = _NewtonState(
        x=x0,
        gradient=graph.gradient(x0),
        num_steps=jnp.zeros((), jnp.int32),
        last_step=inf,
        done=jnp.array(False),
        stable=jnp.array(False),
        chord_step=inf,
        system=placeholder,
    )

    def cond(state):
        return (state.num_steps < max_steps) & ~state.done

    return jax.lax.while_loop(
        cond, lambda s: _newton_step(graph, s, tol, kind, jacobian_dtype), init
    )


class _Outcome(eqx.Module):
    """What either loop hands back: the iterate, its gradient, the result
    code, whether it converged and is stable (a strict minimum), and the
    statistics."""

    x: Float[Array, " n"]
    gradient: Float[Array, " n"]
    result: RESULTS
    converged: Bool[Array, ""]
    stable: Bool[Array, ""]
    stats: dict[str, Array]


def _run_newton(graph, x0, tol, max_steps, kind, jacobian_dtype) -> _Outcome:
    state = _newton(graph, x0, tol, max_steps, kind, jacobian_dtype)
    converged = state.done & jnp.isfinite(state.last_step)
    stable = state.stable & converged
    finite = jnp.isfinite(state.last_step)
    result = RESULTS.where(
        converged,
        RESULTS.where(stable, RESULTS.successful, RESULTS.unstable_root),
        RESULTS.where(finite, RESULTS.max_steps_reached, RESULTS.nonfinite_iterate),
    )
    stats = {"num_steps": state.num_steps, "max_step": state.last_step}
    return _Outcome(state.x, state.gradient, result, converged, stable, stats)


def _run_least_squares(
    graph, x0, tol, max_steps, kind, damped, jacobian_dtype
) -> _Outcome:
    state = least_squares(graph, x0, tol, max_steps, kind, damped, jacobian_dtype)
    result, positive, _ = least_squares_result(state)
    stats = {
        "num_steps": state.num_steps,
        "num_accepted": state.num_accepted,
        "max_step": state.last_step,
        "cost": state.cost,
        "damping": state.damping,
    }
    converged = state.converged & positive
    # the loop stops before linearising at its last point
    gradient = graph.gradient(state.x)
    return _Outcome(state.x, gradient, result, converged, converged, stats)


@eqx.filter_custom_jvp
def _implicit(graph, x, ok, *, kind):
    """`x`, the graph's root, whose derivatives with respect to the graph's
    arrays are those of the implicit function theorem."""
    del graph, ok, kind
    return x


@_implicit.def_jvp
def _implicit_jvp(primals, tangents, *, kind):
    graph, x, ok = primals
    t_graph, _, _ = tangents
    if t_graph is None:
        return x, jnp.zeros_like(x)
    t_graph = jax.tree.map(
        lambda p, t: jnp.zeros_like(p) if t is None and eqx.is_inexact_array(p) else t,
        graph,
        t_graph,
        is_leaf=lambda v: v is None,
    )
    # a failed solve's point may be NaN, its matrix singular: its derivatives
    # are NaN through `never_silent`, and the solve here must not fail (lineax
    # rejects non-finite operators in reverse mode), so it solves with the
    # identity in place of the Jacobian
    root = jnp.where(ok, jax.lax.stop_gradient(x), jnp.zeros_like(x))
    _, rhs = eqx.filter_jvp(lambda g: g.gradient(root), (graph,), (t_graph,))
    constant = jax.tree.map(
        lambda v: jax.lax.stop_gradient(v) if eqx.is_array(v) else v, graph
    )
    # at the answer the implicit function theorem needs the exact Hessian
    # (Newton's matrix), whichever method found the answer
    system = graph_system(constant, root, kind).or_identity(ok)
    rhs = jnp.where(ok, rhs, jnp.zeros_like(rhs))
    return x, -system.solve(rhs)


_METHODS = ("auto", "newton", "gauss_newton", "levenberg_marquardt")


def _choose_method(graph: FactorGraph, method) -> str:
    """`"newton"`, `"gauss_newton"` or `"levenberg_marquardt"`: `"auto"`
    takes Levenberg–Marquardt when every factor is a residual."""
    if not isinstance(method, str) or method not in _METHODS:
        raise ValueError(
            "`method` must be 'auto', 'newton', 'gauss_newton' or "
            f"'levenberg_marquardt', got {method!r}."
        )
    residual = all(
        isinstance(f, GaussianFactor | ResidualFactor) for f in graph.factors
    )
    if method == "auto":
        return "levenberg_marquardt" if residual else "newton"
    if method != "newton" and not residual:
        kinds = sorted(
            {
                type(f).__name__
                for f in graph.factors
                if not isinstance(f, GaussianFactor | ResidualFactor)
            }
        )
        raise ValueError(
            f"`method={method!r}` needs a graph of residual factors "
            f"(GaussianFactor, ResidualFactor); this graph also has {kinds}, "
            "whose energy is not a sum of squares. Use method='newton' (or "
            "'auto')."
        )
    return method


def _check_dtype(name: str, dtype) -> None:
    """A `TypeError` naming `name` unless `dtype` is float32 or float64."""
    try:
        dtype = jnp.dtype(dtype)
    except TypeError as err:
        raise TypeError(f"`{name}` must be a floating dtype, got {dtype!r}.") from err
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"`{name}` must be a real floating dtype (float32 or float64), got "
            f"{dtype}: the graph is solved in it."
        )
    if dtype.itemsize < 4:
        raise TypeError(
            f"`{name}` is {dtype}, which the graph's linear solves (LU "
            "factorisations) do not support: solve in float32 or float64 "
            "(`dtype=jnp.float32`) and cast the answer."
        )


def _solve_dtype(graph: FactorGraph, init, dtype) -> Array:
    """The start vector, its dtype checked (naming `dtype` or `init`)."""
    if dtype is not None:
        try:
            _check_dtype("dtype", dtype)
        except TypeError:
            raise
        except Exception as err:  # not a dtype at all
            raise TypeError(
                f"`dtype` must be a floating dtype, got {dtype!r}."
            ) from err
        return graph.flatten(init, dtype)
    for name, value in ({} if init is None else dict(init)).items():
        kind = jnp.asarray(value).dtype
        if jnp.issubdtype(kind, jnp.complexfloating) or (
            jnp.issubdtype(kind, jnp.floating) and kind.itemsize < 4
        ):
            raise TypeError(
                f"`init[{name!r}]` has dtype {kind}; the graph is solved in "
                "float32 or float64: cast it, or pass `dtype`."
            )
    return graph.flatten(init, dtype)


def _untouched(graph: FactorGraph) -> list[str]:
    """The variables no factor touches, by name (`'x'[3]` in a family)."""
    lay = graph.layout
    touched = np.zeros(len(lay.var_dim), dtype=bool)
    for ids in lay.row_vars:
        touched[np.unique(ids)] = True
    names = []
    for name, count, _, single in graph.variables:
        v0 = lay.family_var0[name]
        for i in np.flatnonzero(~touched[v0 : v0 + count]):
            names.append(repr(name) if single else f"{name!r}[{i}]")
    return names


def _failure_messages(graph: FactorGraph, method: str, max_steps: int):
    """The messages of a failed graph solve, by result code (static: built
    when tracing, naming the variables no factor touches)."""
    untouched = _untouched(graph)
    where = (
        f" No factor touches {', '.join(untouched[:5])}"
        + (f" and {len(untouched) - 5} more" if len(untouched) > 5 else "")
        + ": give each variable a prior or a factor."
        if untouched
        else ""
    )
    return [
        (
            RESULTS.singular,
            "solve_graph: the graph does not determine its answer: the "
            "least-squares matrix at the solve's point is singular (a variable "
            "with no factor, no prior, or only zero precisions; or a gauge "
            f"freedom no prior fixes).{where} The answer is NaN.",
        ),
        (
            RESULTS.nonfinite_iterate,
            "solve_graph: the graph's gradient became non-finite (NaN or inf) "
            f"during the {method} solve: a factor's target, measurement, "
            "precision or residual is NaN or inf at `init` or on the way (a "
            "residual undefined there), or the Jacobian is singular (a "
            f"variable that nothing determines).{where} The answer is NaN.",
        ),
        (
            RESULTS.max_steps_reached,
            f"solve_graph: the maximum number of steps (`max_steps` = "
            f"{max_steps}) was reached before the {method} solve converged: "
            "raise `max_steps`, start nearer "
            f"the answer (`init`), or loosen `tol`.{where} The answer is NaN.",
        ),
    ]


def _throw(sol: "GraphSolution", failed, messages) -> "GraphSolution":
    """`sol`, carrying a run-time check that raises the graph's message for
    its result code when `failed`."""
    index = jnp.zeros((), jnp.int32)
    for i, (code, _) in enumerate(messages):
        index = jnp.where(sol.result == code, jnp.int32(i), index)
    texts = [text for _, text in messages]
    return eqx.branched_error_if(sol, failed, index, texts)


@filter_jit
def solve_graph(
    graph: FactorGraph,
    init: Mapping[str, Float[ArrayLike, "..."]] | None = None,
    *,
    method: str = "auto",
    tol: float | None = None,
    max_steps: int = 100,
    linear_solver: LinearSolver = "auto",
    dtype=None,
    jacobian_dtype=None,
    throw: bool = True,
) -> GraphSolution:
    r"""The graph's MAP point: a stable root of $\nabla E$ (the minimum of
    its energy $E$).

    A graph whose factors are all residuals
    ([`retrax.relations.GaussianFactor`][],
    [`retrax.relations.ResidualFactor`][]: $E = \tfrac12\sum_i\lVert
    r_i\rVert^2$) is solved by Levenberg–Marquardt on the stacked residuals
    (`method="levenberg_marquardt"`, the default there): each step solves
    $(H + \lambda D)\delta = -\nabla E$ with the Gauss–Newton matrix $H =
    \sum_i J_i^\top J_i$ and Marquardt's scaling $D$, and $\lambda$
    follows the ratio of the actual to the predicted decrease of $E$
    (Nielsen's rule); it starts at 0, so a linear-Gaussian graph is solved
    in one step. `method="gauss_newton"` takes every Gauss–Newton step
    whole. Below float64 the least-squares steps never form $H$ or $\nabla
    E = \sum_i J_i^\top r_i$: they come from a QR factorisation of the
    whitened residual rows $[J_i \mid -r_i]$, block by block (the
    square-root form of the same elimination), whose errors grow with the
    condition number of $J$ rather than that of $H$, its square; a float32
    odometry chain of 40,000 poses ($\kappa(H) \approx 10^9$, beyond
    float32's $1/\epsilon$) converges in three steps, where float64 takes
    two. A graph with learned relations
    ([`retrax.relations.RelationFactor`][], whose field need not be the
    gradient of an energy) is solved by Newton's method on $\nabla E$
    with a backtracking line search on $\tfrac12\lVert\nabla
    E\rVert^2$ (`method="newton"`, the default there).

    Each step evaluates every factor's rows in one `vmap`-ed call and
    assembles the step's matrix, block tridiagonal in a bandwidth-reducing
    order of the variables for chains and trees (a solve linear in the
    number of variables, `linear_solver="banded"`: block elimination with
    each Schur complement LU-factorised once), or dense, solved by LU
    through lineax (`"dense"`, any graph).

    Derivatives of the answer with respect to every floating array of the
    graph (the factors' parameters, measurements, precisions, the relations'
    networks) come by the implicit function theorem with the exact Hessian
    (Newton's matrix) at the answer, whichever method found it: one linear
    solve (its transpose in reverse mode), never a pass back through the
    iterations. `jax.grad`, `jax.jvp`, `jax.jit` and `jax.vmap` all apply.
    With `throw=False`, a solve that did not succeed returns NaN values and
    NaN derivatives (for the failed members of a `vmap` only) with its
    result code.

    **Arguments:**

    - `graph`: the [`retrax.relations.FactorGraph`][].
    - `init`: start values by variable name (others start at 0).
    - `method`: `"auto"` (Levenberg–Marquardt for a graph of residual
      factors, Newton otherwise), `"levenberg_marquardt"`,
      `"gauss_newton"` (both for residual graphs only) or `"newton"`.
    - `tol`: the tolerance of the last step, $\max|\delta| \le
      \mathrm{tol}(1 + \max|x|)$: a positive finite float; `1e-9` in float64
      and `1e-5` in float32 by default.
    - `max_steps`: the most steps (trial steps, rejected ones included, for
      Levenberg–Marquardt), a positive integer.
    - `linear_solver`: `"auto"` (banded when the graph's order gives at least
      four blocks, else dense), `"dense"` or `"banded"`.
    - `dtype`: the solve's dtype, float32 or float64 (a `TypeError` naming
      `dtype` otherwise: float16 and bfloat16 have no LU); `init`'s floating
      dtype, or JAX's default float, by default.
    - `jacobian_dtype`: the dtype in which the step's matrix (Newton's, or the
      Gauss–Newton matrix) is evaluated (the factors' floating arrays and the
      iterate cast to it); the solve's dtype by default. `jnp.float32` in a
      float64 solve of learned relations (networks trained in float32) about
      halves the cost of their Jacobians, the bulk of a step: the gradient,
      the convergence test and the answer stay in the solve's dtype, so the
      answer is the same root to the tolerance, reached by a quasi-Newton
      iteration (a linear-Gaussian graph then takes a few steps instead of
      one). The derivatives always use the exact Jacobian in the solve's
      dtype.
    - `throw`: whether a solve that does not succeed raises (a message that
      names the graph solve and the variables no factor touches).

    **Returns:**

    A [`retrax.relations.GraphSolution`][]: `result` is `successful`,
    `unstable_root` (Newton only: converged to a saddle, reported, never
    raised), `singular` (converged, but the factors do not determine every
    variable), `max_steps_reached` or `nonfinite_iterate`; `stats` holds
    `num_steps` and `max_step`, and for the least-squares methods
    `num_accepted` (the steps taken), `cost` ($E$ at the answer) and
    `damping` (the last $\lambda$).
    """
    if not isinstance(graph, FactorGraph):
        raise TypeError(f"`graph` must be a FactorGraph, got {type(graph).__name__}.")
    tol = check_tol(tol)
    check_positive_int("max_steps", max_steps)
    kind = choose_solver(graph, linear_solver)
    method = _choose_method(graph, method)
    x0 = _solve_dtype(graph, init, dtype)
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
    constant = jax.tree.map(
        lambda v: jax.lax.stop_gradient(v) if eqx.is_array(v) else v, graph
    )
    x0 = jax.lax.stop_gradient(x0)
    if method == "newton":
        out = _run_newton(constant, x0, tol, max_steps, kind, jacobian_dtype)
    else:
        damped = method == "levenberg_marquardt"
        out = _run_least_squares(
            constant, x0, tol, max_steps, kind, damped, jacobian_dtype
        )
    ok = out.converged
    x = _implicit(graph, out.x, ok, kind=kind)
    x = nan_derivatives_unless(x, graph, ok)
    x = jnp.where(ok, x, jnp.asarray(jnp.nan, dtype))
    sol = GraphSolution(
        value=graph.unflatten(x),
        x=x,
        gradient=jnp.where(ok, out.gradient, jnp.asarray(jnp.nan, dtype)),
        converged=ok,
        stable=out.stable,
        result=out.result,
        stats=out.stats,
        linear_solver=kind,
    )
    if not throw:
        return sol
    failed = ~ok
    return _throw(sol, failed, _failure_messages(graph, method, max_steps))
