"""The relation interface: a field over a joint space and the clamped residual
of a query."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Bool, Float

from .._state import as_state


def clamp_mask(rho: Float[Array, " n"]) -> Bool[Array, " n"]:
    """The hard-clamped coordinates: those with an infinite stiffness."""
    return jnp.isposinf(rho)


def coupling_term(
    coupling: Float[Array, "n n"] | None,
    clamped: Bool[Array, " n"],
    diff: Float[Array, " n"],
) -> Float[Array, " n"] | float:
    """`coupling @ diff` between non-clamped coordinates (0 without coupling)."""
    if coupling is None:
        return 0.0
    both = ~clamped[:, None] & ~clamped[None, :]
    return jnp.where(both, coupling, 0) @ jnp.where(clamped, 0, diff)


def soft_stiffness(rho: Float[Array, " n"]) -> Float[Array, " n"]:
    r"""$\rho_i^2$ on the non-clamped coordinates and 0 on clamped ones.

    The `where` selects before squaring, so an infinite $\rho$ never meets a
    zero (no `inf * 0`) and its derivative is exactly 0.
    """
    safe = jnp.where(clamp_mask(rho), jnp.zeros_like(rho), rho)
    return safe * safe


class AbstractImplicitRelation(eqx.Module):
    r"""A relation over a joint space: a field whose stable roots are its answers.

    The interface [`retrax.relations.implicit_infer`][] and the other query
    functions need: the joint dimension `dim`, the prior field
    $g(z)$ (`prior_field`) and its Jacobian (`prior_jacobian`, one
    `jax.jacfwd`). A query's residual
    ([`retrax.relations.AbstractImplicitRelation.implicit_residual`][]) is
    built from the field alone.

    Every relation also says whether its field is the gradient of a known
    potential $U$ (`conservative`, and then `energy` with $\nabla U = g$;
    its Jacobian is then symmetric, which `implicit_infer` uses for the
    adjoint solve), its scale against $-\nabla\log p$ (`effective_lambda`,
    used by the Laplace covariance), its unit (`field_unit`, used by the
    clamp load) and its calibrated off-data test (`support_ratio`).

    Implementations: [`retrax.relations.ImplicitDiffusion`][] (a noise
    predictor), [`retrax.relations.IndexedRelation`][] (a relation over some
    coordinates of a larger joint state) and
    [`retrax.relations.ProductRelation`][] (a weighted sum of relations).
    """

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """The joint dimension $n$."""

    @abc.abstractmethod
    def prior_field(self, z: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
        """The prior field $g(z)$, shape `(n,)`, typed like `z`."""

    @property
    @abc.abstractmethod
    def conservative(self) -> bool:
        """Whether the field is the gradient of `energy`, so that its Jacobian is
        symmetric."""

    @abc.abstractmethod
    def energy(self, z: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        r"""The potential $U$ with $\nabla U = g$, for conservative relations.

        Relations that are not conservative raise `TypeError`.
        """

    @abc.abstractmethod
    def effective_lambda(self, dtype) -> Float[Array, ""]:
        r"""The scale $\lambda_{\mathrm{eff}}$ of the field against
        $-\nabla\log p$ (1 when not known)."""

    @abc.abstractmethod
    def field_unit(self, dtype) -> Float[Array, " n"]:
        r"""Per coordinate, the size of the field one noise standard deviation
        off the data: the unit of a query's clamp load (see
        [`retrax.relations.ImplicitSolution`][]). NaN when not known (then no
        query is flagged off the data); 0 where the relation has no field."""

    @abc.abstractmethod
    def support_ratio(
        self, z: Float[Array, " n"], clamped: Bool[Array, " n"]
    ) -> Float[Array, ""]:
        r"""The calibrated off-data test of a query with hard clamps `clamped`
        at the values `z`: the distance from the clamped values to the nearest
        stored training row over the tolerance (above 1: off the data; see
        [`retrax.relations.calibrate_off_data`][]); 0 without clamps. NaN
        when the relation is not calibrated for these clamps (then the clamp
        load decides)."""

    def check_point(self, name: str, z: ArrayLike) -> Float[Array, " n"]:
        """Check that `z` is one floating point of the joint space."""
        z = as_state(name, z)
        if z.shape != (self.dim,):
            raise ValueError(
                f"`{name}` must be a vector of length {self.dim} (the relation's "
                "joint dimension; for an ImplicitDiffusion, the field nodes' "
                f"dimension), got shape {z.shape}. Draw the nodes with "
                "`field_nodes(key, n)` for the model's `n`."
            )
        return z

    def prior_jacobian(self, z: Float[ArrayLike, " n"]) -> Float[Array, "n n"]:
        r"""The Jacobian $\partial g/\partial z$, by one forward-mode pass.

        **Arguments:**

        - `z`: a point of the joint space, shape `(n,)`.

        **Returns:**

        The `(n, n)` Jacobian; not symmetric for a learned field.
        """
        z = self.check_point("z", z)
        return jax.jacfwd(self.prior_field)(z)

    @abc.abstractmethod
    def belief_precision(self, z: Float[ArrayLike, " n"]) -> Float[Array, "n n"]:
        r"""The precision of the relation's Laplace belief at `z`, before a
        query's clamps and soft inputs (see
        [`retrax.relations.implicit_laplace`][]): for a single field,
        $\mathrm{sym}(J)/\lambda_{\mathrm{eff}}$ (`laplace_precision`), less
        any smoothing the relation undoes; for a composed relation, built
        from its members'.

        **Arguments:**

        - `z`: a point of the joint space, shape `(n,)`.

        **Returns:**

        The symmetric `(n, n)` precision.
        """

    def implicit_residual(
        self,
        z: Float[ArrayLike, " n"],
        z0: Float[ArrayLike, " n"],
        rho: Float[ArrayLike, " n"],
        coupling: Float[ArrayLike, "n n"] | None = None,
    ) -> Float[Array, " n"]:
        r"""The residual of a query, whose roots are the query's answers.

        With stiffness $\rho_i$ (an inverse standard deviation):
        $\rho_i = \infty$ clamps $z_i = z_{0,i}$ (row $z_i - z_{0,i}$), a large
        finite $\rho_i$ is a soft input, a small one an anchor that selects a
        branch, and $\rho_i = 0$ leaves $z_i$ free. On the non-clamped
        coordinates $F$ the residual is $g(z) + \rho^2 (z - z_0)$, plus
        $K_{FF}(z - z_0)_F$ with a `coupling` matrix $K$ (the off-diagonal
        stiffness of a full precision, see [`retrax.relations.Unobserved`][]):
        the gradient of $\tfrac12 (z - z_0)^\top(\mathrm{diag}(\rho^2) +
        K)(z - z_0)$ over the free coordinates. The clamp
        pattern is data: every query has the same `n`-vector residual, so
        queries with different patterns share one compiled program and one
        `vmap`.

        **Arguments:**

        - `z`: the point, shape `(n,)`.
        - `z0`: the query values, shape `(n,)`.
        - `rho`: the stiffnesses, shape `(n,)`, in $[0, \infty]$.
        - `coupling`: `None`, or a symmetric `(n, n)` matrix $K$ of stiffness
          between coordinates (its rows and columns on clamped coordinates
          are ignored).

        **Returns:**

        The residual, shape `(n,)`.
        """
        z = self.check_point("z", z)
        z0 = self.check_point("z0", z0).astype(z.dtype)
        rho = self.check_point("rho", rho).astype(z.dtype)
        clamped = clamp_mask(rho)
        diff = z - z0
        free_rows = self.prior_field(z) + soft_stiffness(rho) * diff
        if coupling is not None:
            coupling = jnp.asarray(coupling, z.dtype)
            free_rows = free_rows + coupling_term(coupling, clamped, diff)
        return jnp.where(clamped, diff, free_rows)


def laplace_precision(
    relation: AbstractImplicitRelation, z: Float[ArrayLike, " n"]
) -> Float[Array, "n n"]:
    r"""$\mathrm{sym}(J)/\lambda_{\mathrm{eff}}$ at `z`, the precision of the
    Laplace belief of a relation's field: its `prior_jacobian` symmetrised,
    over its `effective_lambda`."""
    z = relation.check_point("z", z)
    jac = relation.prior_jacobian(z)
    return 0.5 * (jac + jac.T) / relation.effective_lambda(z.dtype)
