"""Beliefs about a query's answer: the Laplace covariance, and Gaussian
mixtures over roots; both marginalised onto chosen coordinates."""

from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._deprecated import renamed_argument
from .._never_silent import nan_unless
from ._abstract_relation import AbstractImplicitRelation, clamp_mask, soft_stiffness
from ._gaussian import AbstractGaussian, CanonicalGaussian, MomentGaussian, as_coords
from ._implicit_energy import has_energy, implicit_energy
from ._roots import ImplicitRoots, implicit_roots
from ._solution import RESULTS, ImplicitSolution


def _effective_lambda(relation: AbstractImplicitRelation, dtype) -> Array:
    """`lam * sum_k w_k sigma_k^2 / alpha_k^2`: the field scale vs -grad log p."""
    return relation.effective_lambda(dtype)


@renamed_argument("model", "relation")
def implicit_laplace(
    relation: AbstractImplicitRelation,
    sol: ImplicitSolution,
    rho: Float[ArrayLike, " n"],
    *,
    coupling: Float[ArrayLike, "n n"] | None = None,
) -> Float[Array, "n n"]:
    r"""The Laplace covariance of a query's answer.

    The field approximates $\lambda_{\mathrm{eff}}(-\nabla\log p)$ with
    $\lambda_{\mathrm{eff}} = \lambda\sum_k w_k\sigma_k^2/\alpha_k^2$ (1 when
    the relation was built with `lam = density_lambda(schedule, nodes)`), so
    near a stable answer $-\nabla^2\log p \approx
    \mathrm{sym}(J_{FF})/\lambda_{\mathrm{eff}}$ and the covariance of the
    free coordinates is $\lambda_{\mathrm{eff}}\,\mathrm{sym}(J_{FF})^{-1}$,
    where $J_{FF}$ includes the soft inputs' $\rho_F^2$ (their evidence) and
    the query's `coupling` (the off-diagonal part of a full precision).
    Clamped coordinates are known exactly: their rows and columns are 0.
    The relation's part, $\mathrm{sym}(J)/\lambda_{\mathrm{eff}}$, is its
    [`retrax.relations.AbstractImplicitRelation.belief_precision`][]: with the
    nodes' smoothing removed for an `ImplicitDiffusion` built with
    `deblur=True`.

    **Arguments:**

    - `relation`: the implicit field the query was solved with.
    - `sol`: the query's solution.
    - `rho`: the query's stiffnesses.
    - `coupling`: the query's coupling matrix, if it had one (see
      [`retrax.relations.implicit_infer`][]).

    **Returns:**

    The `(n, n)` covariance; NaN unless `sol` is converged and stable.
    """
    z = sol.value
    dtype = z.dtype
    rho = relation.check_point("rho", rho).astype(dtype)
    clamped = clamp_mask(rho)
    both = ~clamped[:, None] & ~clamped[None, :]
    # the query's own terms are in field units: over lambda_eff, precisions
    query = jnp.diag(soft_stiffness(rho))
    if coupling is not None:
        coupling = jnp.where(both, jnp.asarray(coupling, dtype), 0)
        query = query + 0.5 * (coupling + coupling.T)
    precision = relation.belief_precision(z) + query / _effective_lambda(
        relation, dtype
    )
    mat = jnp.where(both, precision, 0) + jnp.diag(clamped.astype(dtype))
    cov = jnp.where(both, jnp.linalg.inv(mat), 0)
    return nan_unless(sol.converged & sol.stable, cov)


class LaplaceBelief(AbstractGaussian):
    """A Gaussian belief about a query's answer.

    A Gaussian in moment form that remembers which coordinates were clamped
    (their variance is 0, so the canonical form exists only for a marginal
    onto free coordinates).

    **Attributes:**

    - `mean`: the answer $z^*$, shape `(n,)`.
    - `cov`: its covariance, shape `(n, n)`, zero on clamped coordinates.
    - `free`: the coordinates that are not clamped.
    """

    mean: Float[Array, " n"]
    cov: Float[Array, "n n"]
    free: Bool[Array, " n"]

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    def moment(self) -> MomentGaussian:
        """`MomentGaussian(mean, cov)`, `cov` symmetrised (an inverse computed in
        floating point is symmetric only to rounding)."""
        return MomentGaussian(mean=self.mean, cov=0.5 * (self.cov + self.cov.T))

    def canonical(self) -> CanonicalGaussian:
        """The canonical form (NaN where a coordinate is clamped: marginalise
        onto free coordinates first)."""
        return self.moment().canonical()

    def marginal(self, coords: Sequence[int] | ArrayLike) -> "LaplaceBelief":
        """The belief over `coords`, in their order."""
        idx = as_coords(coords, self.dim)
        return LaplaceBelief(
            mean=self.mean[idx], cov=self.cov[np.ix_(idx, idx)], free=self.free[idx]
        )


@renamed_argument("model", "relation")
def laplace_belief(
    relation: AbstractImplicitRelation,
    sol: ImplicitSolution,
    rho: Float[ArrayLike, " n"],
    coords: Sequence[int] | ArrayLike | None = None,
    *,
    coupling: Float[ArrayLike, "n n"] | None = None,
) -> LaplaceBelief:
    """Package an answer and its [`retrax.relations.implicit_laplace`][] covariance.

    **Arguments:**

    - `relation`: the implicit field the query was solved with.
    - `sol`: the query's solution.
    - `rho`: the query's stiffnesses.
    - `coords`: the coordinates to keep (the marginal belief over them, in
      their order); all by default. For a [`retrax.relations.Factor`][],
      `factor.coords(name, ...)` gives a channel's coordinates.
    - `coupling`: the query's coupling matrix, if it had one (see
      [`retrax.relations.implicit_infer`][]).

    **Returns:**

    A [`retrax.relations.LaplaceBelief`][].
    """
    rho = relation.check_point("rho", rho).astype(sol.value.dtype)
    belief = LaplaceBelief(
        mean=sol.value,
        cov=implicit_laplace(relation, sol, rho, coupling=coupling),
        free=~clamp_mask(rho),
    )
    return belief if coords is None else belief.marginal(coords)


class MixtureBelief(eqx.Module):
    """A Gaussian-mixture belief about a query's answer.

    **Attributes:**

    - `weights`: the normalised component weights, shape `(m,)` (0 for
      invalid slots).
    - `means`: the component means, shape `(m, n)`.
    - `covs`: the component covariances, shape `(m, n, n)`.
    """

    weights: Float[Array, " m"]
    means: Float[Array, "m n"]
    covs: Float[Array, "m n n"]

    def marginal(self, coords: Sequence[int] | ArrayLike) -> "MixtureBelief":
        """The mixture's marginal over `coords` (same weights), in their order."""
        idx = as_coords(coords, self.means.shape[1])
        return MixtureBelief(
            weights=self.weights,
            means=self.means[:, idx],
            covs=self.covs[:, idx][:, :, idx],
        )


@renamed_argument("model", "relation")
def implicit_mixture(
    relation: AbstractImplicitRelation,
    roots: ImplicitRoots | None,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    *,
    coords: Sequence[int] | ArrayLike | None = None,
    **roots_options: Any,
) -> MixtureBelief:
    r"""Combine the stable answers of a query into a Gaussian mixture.

    Each valid root $z_k$ gets its Laplace covariance $\Sigma_k$
    ([`retrax.relations.implicit_laplace`][]) and the weight
    $\propto \exp(-U(z_k)/\lambda_{\mathrm{eff}})\det(\Sigma_k)^{1/2}$ (the
    Laplace approximation of the probability mass of its basin), with $U$ from
    [`retrax.relations.implicit_energy`][] including the query's soft terms.
    For fields without a known potential the valid roots get equal weights.

    **Arguments:**

    - `relation`: the implicit field.
    - `roots`: the query's answers from [`retrax.relations.implicit_roots`][],
      or `None` to find them here: `implicit_roots(relation, z0, rho,
      **roots_options)` (pass `key=` for random starts or `starts=`).
    - `z0`, `rho`: the query.
    - `coords`: the coordinates to keep (the marginal mixture over them);
      all by default. The weights are those of the joint basins.
    - `**roots_options`: the options of `implicit_roots` when `roots` is
      `None` (an error otherwise).

    **Returns:**

    A [`retrax.relations.MixtureBelief`][] over the roots' slots.
    """
    if roots is None:
        roots = implicit_roots(relation, z0, rho, **roots_options)
    elif roots_options:
        raise ValueError(
            f"options {sorted(roots_options)} are for finding roots; pass them "
            "with `roots=None`, or leave them out when giving `roots`."
        )
    dtype = roots.value.dtype
    z0 = relation.check_point("z0", z0).astype(dtype)
    rho = relation.check_point("rho", rho).astype(dtype)
    free = ~clamp_mask(rho)

    def component(z, conv, stable):
        sol = ImplicitSolution(
            value=z,
            residual=jnp.zeros_like(z),
            converged=conv,
            stable=stable,
            result=RESULTS.successful,
            clamp_load=jnp.zeros((), z.dtype),
            off_data=jnp.zeros((), bool),
            support_ratio=jnp.zeros((), z.dtype),
            stats={"num_steps": jnp.array(0)},
        )
        return implicit_laplace(relation, sol, rho)

    valid = roots.valid
    covs = jax.vmap(component)(roots.value, valid, valid)
    if has_energy(relation):
        lam_eff = _effective_lambda(relation, dtype)
        u = (
            jax.vmap(lambda z: implicit_energy(relation, z, z0, rho))(roots.value)
            / lam_eff
        )
        eye = jnp.eye(z0.shape[0], dtype=dtype)
        mat = jnp.where(free[:, None] & free[None, :], covs, eye)
        _, logdet = jnp.linalg.slogdet(jnp.where(valid[:, None, None], mat, eye))
        logw = -u + 0.5 * logdet
    else:
        logw = jnp.zeros(valid.shape, dtype)
    logw = jnp.where(valid, logw, -jnp.inf)
    weights = jax.nn.softmax(logw)
    weights = jnp.where(valid, weights, jnp.zeros((), dtype))
    belief = MixtureBelief(weights=weights, means=roots.value, covs=covs)
    return belief if coords is None else belief.marginal(coords)
