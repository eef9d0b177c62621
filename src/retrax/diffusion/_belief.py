"""Beliefs about a query's answer: the Laplace covariance, and Gaussian
mixtures over roots."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from ._never_silent import nan_unless
from ._potential import has_energy, implicit_energy
from ._relation import AbstractImplicitRelation, clamp_mask, soft_stiffness
from ._roots import ImplicitRoots
from ._solution import RESULTS, ImplicitSolution


def _effective_lambda(model: AbstractImplicitRelation, dtype) -> Array:
    """`lam * sum_k w_k sigma_k^2 / alpha_k^2`: the field scale vs -grad log p."""
    return model.effective_lambda(dtype)


def implicit_laplace(
    model: AbstractImplicitRelation,
    sol: ImplicitSolution,
    rho: Float[ArrayLike, " n"],
) -> Float[Array, "n n"]:
    r"""The Laplace covariance of a query's answer.

    The field approximates $\lambda_{\mathrm{eff}}(-\nabla\log p)$ with
    $\lambda_{\mathrm{eff}} = \lambda\sum_k w_k\sigma_k^2/\alpha_k^2$ (1 when
    the model was built with `lam = density_lambda(schedule, nodes)`), so
    near a stable answer $-\nabla^2\log p \approx
    \mathrm{sym}(J_{FF})/\lambda_{\mathrm{eff}}$ and the covariance of the
    free coordinates is $\lambda_{\mathrm{eff}}\,\mathrm{sym}(J_{FF})^{-1}$,
    where $J_{FF}$ includes the soft inputs' $\rho_F^2$ (their evidence).
    Clamped coordinates are known exactly: their rows and columns are 0.

    **Arguments:**

    - `model`: the implicit field the query was solved with.
    - `sol`: the query's solution.
    - `rho`: the query's stiffnesses.

    **Returns:**

    The `(n, n)` covariance; NaN unless `sol` is converged and stable.
    """
    z = sol.z
    dtype = z.dtype
    rho = model.check_point("rho", rho).astype(dtype)
    clamped = clamp_mask(rho)
    jac = model.prior_jacobian(z) + jnp.diag(soft_stiffness(rho))
    sym = 0.5 * (jac + jac.T)
    both = ~clamped[:, None] & ~clamped[None, :]
    mat = jnp.where(both, sym, 0) + jnp.diag(clamped.astype(dtype))
    cov = jnp.linalg.inv(mat) * _effective_lambda(model, dtype)
    cov = jnp.where(both, cov, 0)
    return nan_unless(sol.converged & sol.stable, cov)


class LaplaceBelief(eqx.Module):
    """A Gaussian belief about a query's answer.

    **Attributes:**

    - `mean`: the answer $z^*$, shape `(n,)`.
    - `cov`: its covariance, shape `(n, n)`, zero on clamped coordinates.
    - `free`: the coordinates that are not clamped.
    """

    mean: Float[Array, " n"]
    cov: Float[Array, "n n"]
    free: Bool[Array, " n"]


def laplace_belief(
    model: AbstractImplicitRelation,
    sol: ImplicitSolution,
    rho: Float[ArrayLike, " n"],
) -> LaplaceBelief:
    """Package an answer and its [`retrax.diffusion.implicit_laplace`][] covariance.

    **Arguments:**

    - `model`: the implicit field the query was solved with.
    - `sol`: the query's solution.
    - `rho`: the query's stiffnesses.

    **Returns:**

    A [`retrax.diffusion.LaplaceBelief`][].
    """
    rho = model.check_point("rho", rho).astype(sol.z.dtype)
    return LaplaceBelief(
        mean=sol.z, cov=implicit_laplace(model, sol, rho), free=~clamp_mask(rho)
    )


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


def implicit_mixture(
    model: AbstractImplicitRelation,
    roots: ImplicitRoots,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
) -> MixtureBelief:
    r"""Combine the stable answers of a query into a Gaussian mixture.

    Each valid root $z_k$ gets its Laplace covariance $\Sigma_k$
    ([`retrax.diffusion.implicit_laplace`][]) and the weight
    $\propto \exp(-U(z_k)/\lambda_{\mathrm{eff}})\det(\Sigma_k)^{1/2}$ (the
    Laplace approximation of the probability mass of its basin), with $U$ from
    [`retrax.diffusion.implicit_energy`][] including the query's soft terms.
    For fields without a known potential the valid roots get equal weights.

    **Arguments:**

    - `model`: the implicit field.
    - `roots`: the query's answers from [`retrax.diffusion.implicit_roots`][].
    - `z0`, `rho`: the query.

    **Returns:**

    A [`retrax.diffusion.MixtureBelief`][] over the `n_starts` slots.
    """
    dtype = roots.z.dtype
    z0 = model.check_point("z0", z0).astype(dtype)
    rho = model.check_point("rho", rho).astype(dtype)
    free = ~clamp_mask(rho)

    def component(z, conv, stable):
        sol = ImplicitSolution(
            z=z,
            residual=jnp.zeros_like(z),
            steps=jnp.array(0),
            converged=conv,
            stable=stable,
            result=RESULTS.successful,
            clamp_load=jnp.zeros((), z.dtype),
            off_data=jnp.zeros((), bool),
        )
        return implicit_laplace(model, sol, rho)

    valid = roots.valid
    covs = jax.vmap(component)(roots.z, valid, valid)
    if has_energy(model):
        lam_eff = _effective_lambda(model, dtype)
        u = jax.vmap(lambda z: implicit_energy(model, z, z0, rho))(roots.z) / lam_eff
        eye = jnp.eye(z0.shape[0], dtype=dtype)
        mat = jnp.where(free[:, None] & free[None, :], covs, eye)
        _, logdet = jnp.linalg.slogdet(jnp.where(valid[:, None, None], mat, eye))
        logw = -u + 0.5 * logdet
    else:
        logw = jnp.zeros(valid.shape, dtype)
    logw = jnp.where(valid, logw, -jnp.inf)
    weights = jax.nn.softmax(logw)
    weights = jnp.where(valid, weights, jnp.zeros((), dtype))
    return MixtureBelief(weights=weights, means=roots.z, covs=covs)
