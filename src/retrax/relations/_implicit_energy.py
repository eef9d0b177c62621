"""The potential of a conservative relation's query."""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._deprecated import renamed_argument
from ._abstract_relation import AbstractImplicitRelation, clamp_mask, soft_stiffness


def has_energy(relation: AbstractImplicitRelation) -> bool:
    """Whether [`retrax.relations.implicit_energy`][] is defined for `relation`."""
    return relation.conservative


@renamed_argument("model", "relation")
def implicit_energy(
    relation: AbstractImplicitRelation,
    z: Float[ArrayLike, " n"],
    z0: Float[ArrayLike, " n"] | None = None,
    rho: Float[ArrayLike, " n"] | None = None,
) -> Float[Array, ""]:
    r"""The potential $U$ of a conservative field: $\nabla U = g$.

    For a predictor with a log-density (a Gaussian mixture, where
    $\hat\epsilon = -\sigma_t\nabla_x\log p_t$) or an energy
    ([`retrax.diffusion.EnergyNetwork`][], $\hat\epsilon = \sigma_t\nabla_x
    E$), with $x_k = \alpha_k z + \sigma_k e_k$:

    $U(z) = \sum_k w_k\lambda_k(\sigma_k/\alpha_k)\,E_k(x_k) -
    (\sum_k w_k\lambda_k e_k)^\top z$, with $E_k = -\log p_{t_k}$ or the
    network's energy. Given a query (`z0`, `rho`), the soft terms
    $\tfrac12\sum_F\rho_i^2(z_i - z_{0,i})^2$ are added, so that the query's
    residual is the gradient of $U$ on the free coordinates.

    **Arguments:**

    - `relation`: the implicit field; its predictor must be a
      `GaussianMixtureEps` or an `EnergyNetwork`.
    - `z`: the point, shape `(n,)`.
    - `z0`, `rho`: an optional query.

    **Returns:**

    The scalar potential (up to a constant).
    """
    if not has_energy(relation):
        raise TypeError(
            "implicit_energy needs a conservative relation with a known potential "
            "(a GaussianMixtureEps or EnergyNetwork predictor, or products and "
            f"restrictions of those), got {type(relation).__name__}" + "."
        )
    z = relation.check_point("z", z)
    dtype = z.dtype
    u = relation.energy(z)
    if (z0 is None) != (rho is None):
        raise ValueError("give both `z0` and `rho` for a query's energy, or neither.")
    if z0 is not None:
        z0 = relation.check_point("z0", z0).astype(dtype)
        rho = relation.check_point("rho", rho).astype(dtype)
        diff = jnp.where(clamp_mask(rho), jnp.zeros((), dtype), z - z0)
        u = u + 0.5 * jnp.sum(soft_stiffness(rho) * diff**2)
    return u
