"""A guarded Newton root finder that settles only on stable roots."""

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx
from jax import lax
from jaxtyping import Array, Bool, Float, PyTree, Scalar

from ._line_search import backtrack


class _GuardedState(eqx.Module):
    f: Float[Array, " n"]
    jac: Float[Array, "n n"] | None
    converged: Bool[Array, ""]
    stable: Bool[Array, ""]
    lmin: Float[Array, ""]
    vmin: Float[Array, " n"]
    reflect: Float[Array, "n n"] | None
    # The result of the linear solve of the step that led here.
    result: optx.RESULTS
    y: Float[Array, " n"]


def _residual(fn, args):
    """`fn`'s residual at a point, without its auxiliary output."""

    def residual(y):
        out, _ = fn(y, args)
        return out

    return residual


def _fixed_mask(options: dict[str, Any], y: Array) -> Array:
    fixed = options.get("fixed")
    if fixed is None:
        return jnp.zeros(y.shape, dtype=bool)
    return jnp.asarray(fixed, dtype=bool)


def _oriented(v: Array) -> Array:
    # The sign convention of the spec: the largest-magnitude entry is positive.
    big = v[jnp.argmax(jnp.abs(v))]
    return jnp.where(big < 0, -v, v)


def _lanczos_min(matvec, n: int, steps: int, dtype, free: Array):
    """Smallest eigenpair of a symmetric operator on the free subspace.

    Lanczos with full reorthogonalisation from a fixed start; exact (up to
    rounding) when `steps >= n`.
    """
    m = min(steps, n)
    start = jnp.where(free, jnp.ones((n,), dtype), jnp.zeros((n,), dtype))
    start = start + jnp.where(free, jnp.arange(n, dtype=dtype) * 1e-3, 0)
    start = start / jnp.maximum(jnp.linalg.norm(start), jnp.finfo(dtype).tiny)
    basis = jnp.zeros((m + 1, n), dtype).at[0].set(start)
    alphas = jnp.zeros((m,), dtype)
    betas = jnp.zeros((m,), dtype)

    active = jnp.zeros((m,), bool)

    def body(i, carry):
        basis, alphas, betas, active = carry
        q = basis[i]
        live = jnp.any(q != 0)
        w = jnp.where(free, matvec(q), 0)
        a = jnp.dot(q, w)
        w = w - basis.T @ (basis @ w)
        w = w - basis.T @ (basis @ w)
        b = jnp.linalg.norm(w)
        ok = live & (b > 1e3 * jnp.finfo(dtype).eps * (1 + jnp.abs(a)))
        nxt = jnp.where(ok, w / jnp.where(ok, b, 1), 0)
        basis = basis.at[i + 1].set(nxt)
        alphas = alphas.at[i].set(a)
        betas = betas.at[i].set(jnp.where(ok, b, 0))
        return basis, alphas, betas, active.at[i].set(live)

    basis, alphas, betas, active = lax.fori_loop(
        0, m, body, (basis, alphas, betas, active)
    )
    # After a breakdown (an invariant subspace found) the remaining rows are
    # decoupled; park them far above the spectrum so they never count as lowest.
    big = jnp.sqrt(jnp.finfo(dtype).max) * 1e-3
    alphas = jnp.where(active, alphas, big)
    tri = jnp.diag(alphas) + jnp.diag(betas[:-1], 1) + jnp.diag(betas[:-1], -1)
    evals, evecs = jnp.linalg.eigh(tri)
    return evals[0], basis[:m].T @ evecs[:, 0]


class GuardedNewton(optx.AbstractRootFinder):
    r"""Newton's method that converges to stable roots only.

    For a residual $r(y)$ whose Jacobian $J$ has a meaningful symmetric part
    (the implicit field of a diffusion model is, approximately, the gradient
    of $-\log p$), a root is *stable* when $\mathrm{sym}(J)$ restricted to
    the free coordinates is positive definite. Each step:

    - where $\mathrm{sym}(J_{FF})$ is positive definite: a Newton step with
      Armijo backtracking on $\tfrac12\|r\|^2$ (measured in units of the
      step's first $\max|r|$, so that a residual whose square overflows is
      searched as any other; the same line search as the Newton solve of
      [`retrax.relations.solve_graph`][]);
    - elsewhere: a saddle-free step (Dauphin et al., "Identifying and
      attacking the saddle point problem in high-dimensional non-convex
      optimization", NeurIPS 2014) $-(J + \Delta)^{-1} r$, where the
      symmetric $\Delta = V\,\mathrm{diag}(\max(|\lambda|, \epsilon) -
      \lambda)\,V^\top$ from the eigendecomposition of $\mathrm{sym}(J_{FF})$
      turns its eigenvalues into their absolute values: directions of negative
      curvature are reversed (near a saddle the distance along them doubles
      each step), positive ones keep their Newton step. Matrix-free, the shift
      is a Levenberg one, $\Delta = \mu D_F$ with
      $\mu = 2\max(-\lambda_{\min}, 0)$. Either step is capped at
      `max_step * (1 + max|y|)`;
    - at a root that is not stable (converged, residual about 0): a step of
      length `escape_radius * (1 + max|y|)` along the eigenvector of
      $\mathrm{sym}(J_{FF})$ with the most negative eigenvalue, its
      largest-magnitude entry made positive.

    It stops when $\max|r| \le$ `atol + rtol * max|y|` and the root is stable.
    Plain Newton (e.g. `optx.Newton`) converges to whatever root is nearest,
    including the unstable one between two branches of a relation.

    The optional `options["fixed"]` (a boolean vector) marks rows that are
    identity rows (hard clamps): they are excluded from the stability test.

    Failures are never quiet. Every step's linear solve (LU on the dense
    matrix, `linear_solver` matrix-free) is a lineax solve whose result is
    kept: a failed one leaves the iterate where it was and ends the solve
    with lineax's result code (`singular`, `max_steps_reached`, `breakdown`,
    ...), which `optx.root_find` raises with `throw=True` and returns in
    `sol.result` with `throw=False`. When the solve ends without converging
    (any failure, including `nonlinear_max_steps_reached` away from a root)
    the returned value is NaN, so that no derivative through
    `optx.root_find(..., throw=False)` is taken at a point that is not a
    root: the implicit adjoint's linear solve then raises instead of
    returning a number. The last iterate is in `sol.state.y`. A converged
    but unstable end (a saddle the solver could not leave within
    `max_steps`) keeps its value, a root whose derivatives are meaningful.
    [`retrax.relations.implicit_infer`][] passes `options["keep_last"] =
    True` to get the last iterate instead of NaN, and makes its derivatives
    NaN itself.

    With `matrix_free=True` the Jacobian is never formed: Newton–Krylov steps
    solve with `linear_solver` (a lineax iterative solver, GMRES by default)
    on Jacobian-vector products, and the stability test and escape direction
    use `lanczos_steps` Lanczos iterations on $\mathrm{sym}(J_{FF})$ by JVPs and
    VJPs (exact when `lanczos_steps >= n`).

    **Arguments:**

    - `rtol`, `atol`: the convergence tolerances on $\max|r|$.
    - `norm`: the norm of the convergence test (`optx.max_norm`).
    - `max_backtracks`: the most halvings of a Newton step.
    - `escape_radius`: the relative length of an escape step.
    - `max_step`: the relative cap on a regularised step.
    - `matrix_free`: whether to use Jacobian-vector products only.
    - `linear_solver`: the lineax solver of the matrix-free steps.
    - `lanczos_steps`: Lanczos iterations of the matrix-free stability test.
    """

    rtol: float
    atol: float
    norm: Callable[[PyTree], Scalar] = optx.max_norm
    max_backtracks: int = 12
    escape_radius: float = 0.1
    max_step: float = 0.5
    matrix_free: bool = eqx.field(static=True, default=False)
    linear_solver: lx.AbstractLinearSolver = lx.GMRES(rtol=1e-10, atol=1e-10)
    lanczos_steps: int = eqx.field(static=True, default=20)

    def __check_init__(self):
        if not (self.max_backtracks >= 0 and self.escape_radius > 0):
            raise ValueError(
                "`max_backtracks` must be nonnegative and `escape_radius` positive."
            )
        if not self.max_step > 0:
            raise ValueError(f"`max_step` must be positive, got {self.max_step}.")

    # -- evaluation at a point ------------------------------------------------

    def _evaluate(self, fn, y, args, fixed, result):
        free = ~fixed
        dtype = y.dtype
        n = y.shape[0]

        res = _residual(fn, args)

        if self.matrix_free:
            f, jvp = jax.linearize(res, y)
            vjp = jax.linear_transpose(jvp, y)

            def symmv(v):
                (vt,) = vjp(v)
                return 0.5 * (jvp(v) + vt)

            lmin, vmin = _lanczos_min(symmv, n, self.lanczos_steps, dtype, free)
            jac = None
            reflect = None
        else:

            def twice(_y):
                out = res(_y)
                return out, out

            jac, f = jax.jacfwd(twice, has_aux=True)(y)
            sym = 0.5 * (jac + jac.T)
            both = free[:, None] & free[None, :]
            mat = jnp.where(both, sym, 0) + jnp.diag(fixed.astype(dtype))
            evals, evecs = jnp.linalg.eigh(mat)
            # Eigenvalue 1 of the fixed block may come first; pick the smallest
            # eigenvalue among vectors living on the free coordinates.
            on_free = jnp.sum(jnp.where(free[:, None], evecs**2, 0), axis=0) > 0.5
            masked = jnp.where(on_free, evals, jnp.inf)
            idx = jnp.argmin(masked)
            lmin, vmin = masked[idx], evecs[:, idx]
            # Saddle-free shift: adding it to J turns every eigenvalue of
            # sym(J_FF) into max(|lambda|, floor), so directions of negative
            # curvature are reversed and positive ones keep their Newton step.
            floor = jnp.sqrt(jnp.finfo(dtype).eps) * (jnp.max(jnp.abs(evals)) + 1)
            shift = jnp.where(on_free, jnp.maximum(jnp.abs(evals), floor) - evals, 0)
            reflect = (evecs * shift) @ evecs.T
            reflect = jnp.where(both, reflect, 0)
        scale = self.atol + self.rtol * jnp.max(jnp.abs(y))
        converged = self.norm(f) <= scale
        # A non-finite Jacobian (or Lanczos value) proves nothing about stability.
        stable = (lmin > 0) & jnp.isfinite(lmin)
        if jac is not None:
            stable = stable & jnp.all(jnp.isfinite(jac))
        return _GuardedState(
            f=f,
            jac=jac,
            converged=converged,
            stable=stable,
            lmin=lmin,
            vmin=_oriented(jnp.where(free, vmin, 0)),
            reflect=reflect,
            result=result,
            y=y,
        )

    def _direction(self, fn, y, args, state, fixed, newton):
        r"""The Newton step (`newton`) or the regularised step, and the result of
        its linear solve.

        One linear solve either way: the two steps differ only in the operator
        (dense: $J$ or $J + \Delta$; matrix-free: the Levenberg shift is 0 or
        $\mu$), so the choice is data, not a second solve.
        """
        dtype = y.dtype
        if self.matrix_free:
            tiny = jnp.finfo(dtype).eps
            floor = jnp.sqrt(tiny) * (jnp.abs(state.lmin) + 1)
            mu = jnp.maximum(2 * jnp.maximum(-state.lmin, 0), floor)
            shift = jnp.where(newton | fixed, jnp.zeros((), dtype), mu).astype(dtype)

            res = _residual(fn, args)
            _, jvp = jax.linearize(res, y)
            operator = lx.FunctionLinearOperator(
                lambda v: jvp(v) + shift * v, jax.eval_shape(lambda: y)
            )
            solver = self.linear_solver
        else:
            # `reflect` is the saddle-free shift; without it, Newton's matrix.
            mat = jnp.where(newton, state.jac, state.jac + state.reflect)
            operator = lx.MatrixLinearOperator(mat)
            solver = lx.LU()
        sol = lx.linear_solve(operator, -state.f, solver, throw=False)
        return sol.value, optx.RESULTS.promote(sol.result)

    # -- optimistix interface -------------------------------------------------

    def init(self, fn, y, args, options, f_struct, aux_struct, tags):
        del f_struct, aux_struct, tags
        fixed = _fixed_mask(options, y)
        return self._evaluate(fn, y, args, fixed, optx.RESULTS.successful)

    def step(self, fn, y, args, options, state, tags):
        del tags
        fixed = _fixed_mask(options, y)
        dtype = y.dtype
        scale = 1 + jnp.max(jnp.abs(y))
        escape = state.converged & ~state.stable
        newton = state.stable & ~state.converged

        def solve(_):
            d, result = self._direction(fn, y, args, state, fixed, newton)
            # The regularised step is capped; a Newton step is backtracked instead.
            cap = self.max_step * scale
            big = jnp.max(jnp.abs(d))
            capped = d * jnp.minimum(1, cap / jnp.maximum(big, jnp.finfo(dtype).tiny))
            return jnp.where(newton, d, capped), result

        def leave(_):
            d = (self.escape_radius * scale) * state.vmin
            return d.astype(dtype), optx.RESULTS.successful

        # Unbatched, only the taken branch runs (no linear solve at an escape);
        # under vmap the cond becomes a select and both run.
        d, result = lax.cond(escape, leave, solve, None)
        # A failed linear solve does not move the iterate: `terminate` stops
        # with its result at the last point the solver could stand behind.
        ok = result == optx.RESULTS.successful
        d = jnp.where(fixed | ~ok, jnp.zeros((), dtype), d)

        # a Newton step is backtracked; a regularised or escape step is not
        alpha, _ = backtrack(
            _residual(fn, args), y, d, state.f, self.max_backtracks, active=newton
        )
        new_y = y + alpha * d
        new_state = self._evaluate(fn, new_y, args, fixed, result)
        return new_y, new_state, None

    def terminate(self, fn, y, args, options, state, tags):
        del fn, y, args, options, tags
        done = state.converged & state.stable
        # A point that passes the convergence and stability tests is an answer
        # however it was reached; otherwise a failed linear solve ends the solve
        # with the linear solver's own result.
        failed = ~done & (state.result != optx.RESULTS.successful)
        result = optx.RESULTS.where(failed, state.result, optx.RESULTS.successful)
        return done | failed, result

    def postprocess(self, fn, y, aux, args, options, state, tags, result):
        del fn, args, tags, result
        if not options.get("keep_last", False):
            y = jnp.where(state.converged, y, jnp.array(jnp.nan, y.dtype))
        return y, aux, {"stable": state.stable, "converged": state.converged}
