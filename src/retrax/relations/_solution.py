"""Result codes and the solution of implicit inference."""

from jaxtyping import Array, Bool, Float

from .._deprecated import deprecated_property
from .._solution import AbstractSolution
from ..diffusion import RESULTS as _DiffusionResults


# Extends `retrax.diffusion.RESULTS` (itself extending `optx.RESULTS` and
# `lx.RESULTS`), so the messages of the nonlinear and linear solvers and of the
# diffusion solves pass through unchanged; a parent's code becomes one of these
# with `RESULTS.promote`.
class RESULTS(_DiffusionResults):  # pyright: ignore
    unstable_root = (
        "The solve converged to an unstable root of the implicit field (the "
        "symmetric part of its free-block Jacobian is not positive definite) and "
        "could not leave it within `max_steps`. It is a saddle or a maximum of the "
        "learned density, not an answer; try another start (`z_init`), an anchor "
        "(a small positive `rho`), or `implicit_roots`."
    )
    invalid_query = (
        "The query is not valid: an entry of `z0` (a clamp, a soft target or a "
        "start: an observed or unobserved channel's value, a latent channel's "
        "start) or of `z_init` is NaN or infinite, a stiffness in `rho` is NaN "
        "or negative (an unobserved channel's precision not positive and "
        "finite), or every coordinate is clamped. Nothing was solved; the "
        "answer is NaN. Rerun the query with `throw=True` for a message that "
        "names the failed check."
    )
    diverged = (
        "Belief propagation diverged: a message or a belief became non-finite "
        "(NaN or inf), a belief lost the precision it had (its mean ran off to "
        "where its factors carry no information), or a factor stopped being "
        "finite at the means the iteration reached (`stats['factor']` names it; "
        "-1 otherwise). Loopy Gaussian belief "
        "propagation need not converge on a graph with loops; try `damping` "
        "(0.5 to 0.9), `schedule='sequential'`, an `init` nearer the answer, or "
        "`solve_graph`. The beliefs are NaN."
    )
    nonfinite_factor = (
        "A factor of the graph is not finite at the first linearisation point "
        "(`init`): a NaN or infinite coefficient, target or precision, or a "
        "residual or relation that is not finite there (`stats['factor']` gives "
        "its index in `graph.factors`). Nothing was propagated; the beliefs are "
        "NaN. Rerun with `throw=True` for a message that names the factor."
    )


class ImplicitSolution(AbstractSolution):
    """The answer to one implicit-inference query.

    **Attributes:**

    - `value`: the answer, the full joint point (clamped coordinates equal
      to `z0`); the name optimistix's `Solution` gives its answer. `z` is its
      old name, deprecated (it reads `value`, with a `DeprecationWarning`).
    - `residual`: the query residual at `value`, full length, clamped
      entries 0; recomputed from `value`, so its derivatives are those of
      the residual at the answer (about 0 at a converged answer, NaN at an
      unconverged one).
    - `converged`: whether $\\max|r_F| \\le \\mathrm{tol}\\,(1 + \\max|z|)$.
    - `stable`: whether the symmetric part of the free-block Jacobian
      $J_{FF} = \\partial g/\\partial z_{FF} + \\mathrm{diag}(\\rho_F^2)$ is
      positive definite at `z`.
    - `result`: a [`retrax.relations.RESULTS`][] code: `successful` when
      converged and stable, `unstable_root` when converged but unstable, or the
      optimistix/lineax failure otherwise.
    - `clamp_load`: what the hard clamps hold against: the largest
      $|g_i(z)|/u_i$ over the clamped coordinates $i$, the prior field at
      the answer in units $u$ of
      [`retrax.relations.AbstractImplicitRelation.field_unit`][] (for an
      `ImplicitDiffusion`, $\\lambda s$ with $s$ the nodes' mean noise
      level): about the clamped values' distance from the data in noise
      standard deviations. Small when the clamped values lie on the data; 0
      without clamps; NaN when the relation's unit is not known.
    - `off_data`: whether the clamped values lie where the model has seen
      no data, so that the answer, though a converged and stable root, is an
      extrapolation. Not an error and not in `result`. For a relation
      calibrated by [`retrax.relations.calibrate_off_data`][] for the
      query's clamps, `support_ratio > 1`; otherwise `clamp_load > 3`; with
      an explicit `off_data_tol`, `clamp_load > off_data_tol`.
    - `support_ratio`: the calibrated off-data test: the distance from the
      clamped values to the nearest stored training row, over the
      calibrated distance (see [`retrax.relations.calibrate_off_data`][]);
      above 1 off the data, 0 without clamps, NaN when the relation is not
      calibrated for the query's clamps.
    - `stats`: the solver's statistics (as in
      [`retrax.diffusion.AbstractSolution`][]): `{"num_steps": ...}`, the
      number of solver iterations. `steps` is a deprecated, read-only name
      for `stats["num_steps"]` (with a `DeprecationWarning`).
    """

    value: Float[Array, " n"]
    residual: Float[Array, " n"]
    converged: Bool[Array, ""]
    stable: Bool[Array, ""]
    result: RESULTS
    clamp_load: Float[Array, ""]
    off_data: Bool[Array, ""]
    support_ratio: Float[Array, ""]
    stats: dict[str, Array]

    z = deprecated_property("ImplicitSolution.z", ".value", lambda s: s.value)
    steps = deprecated_property(
        "ImplicitSolution.steps", '.stats["num_steps"]', lambda s: s.stats["num_steps"]
    )
