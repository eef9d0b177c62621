"""The local free energy of a query's answer: energy plus the entropy term."""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._deprecated import renamed_argument
from ._abstract_relation import AbstractImplicitRelation, clamp_mask
from ._belief import implicit_laplace
from ._implicit_energy import implicit_energy
from ._solution import ImplicitSolution


@renamed_argument("model", "relation")
def local_free_energy(
    relation: AbstractImplicitRelation,
    sol: ImplicitSolution,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
) -> Float[Array, ""]:
    r"""The Laplace free energy of a query's answer.

    $F = U_q(z^*)/\lambda_{\mathrm{eff}} - \tfrac12\log\det(2\pi\Sigma_{FF})$,
    with $U_q$ the query's potential
    ([`retrax.relations.implicit_energy`][] with the soft terms) and
    $\Sigma_{FF}$ the Laplace covariance of the free coordinates
    ([`retrax.relations.implicit_laplace`][]): the energy of the answer
    minus the entropy of its Gaussian belief (up to the constant $|F|/2$),
    i.e. the Laplace approximation of
    $-\log\int\exp(-U_q/\lambda_{\mathrm{eff}})\,dz_F$, exact for a Gaussian
    relation. Lower is more probable: the weights of
    [`retrax.relations.implicit_mixture`][] are $\propto\exp(-F)$ over the
    roots. Like the energy it is defined up to a constant of the relation
    (the same for every query of it), so differences between answers and
    queries are what it measures.

    **Arguments:**

    - `relation`: a conservative relation (see
      [`retrax.relations.implicit_energy`][]).
    - `sol`: the query's converged, stable solution.
    - `z0`, `rho`: the query.

    **Returns:**

    The scalar free energy; NaN unless `sol` is converged and stable.
    """
    z = sol.value
    dtype = z.dtype
    z0 = relation.check_point("z0", z0).astype(dtype)
    rho = relation.check_point("rho", rho).astype(dtype)
    energy = implicit_energy(relation, z, z0, rho) / relation.effective_lambda(dtype)
    free = ~clamp_mask(rho)
    cov = implicit_laplace(relation, sol, rho)
    eye = jnp.eye(z.shape[0], dtype=dtype)
    mat = jnp.where(free[:, None] & free[None, :], 2 * jnp.pi * cov, eye)
    _, logdet = jnp.linalg.slogdet(mat)
    return energy - 0.5 * logdet
