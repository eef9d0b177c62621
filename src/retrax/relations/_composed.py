"""Composed relations: a relation over some coordinates of a larger joint state,
and the weighted product of several relations."""

from collections.abc import Mapping, Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._errors import error_if
from .._validate import check_value
from ._abstract_relation import AbstractImplicitRelation
from ._factor import blockranges


class IndexedRelation(AbstractImplicitRelation):
    r"""A relation that reads only its own coordinates of a larger joint state.

    With $P$ the selection of the coordinates `index` of an `n`-vector, the
    field is $P^\top g(Pz)$: the member's field on its coordinates, 0 on the
    others.

    **Arguments:**

    - `relation`: the member relation, of dimension `len(index)`.
    - `index`: its coordinates in the joint state (distinct integers in
      `[0, dim)`), in the member's order.
    - `dim`: the joint dimension $n$.

    See [`retrax.relations.named_relation`][] for named variable blocks.
    """

    relation: AbstractImplicitRelation
    index: tuple[int, ...] = eqx.field(static=True)
    joint_dim: int = eqx.field(static=True)

    def __init__(
        self,
        relation: AbstractImplicitRelation,
        index: Sequence[int] | ArrayLike,
        dim: int,
    ):
        if not isinstance(relation, AbstractImplicitRelation):
            raise TypeError(
                "`relation` must be an AbstractImplicitRelation (e.g. an "
                f"ImplicitDiffusion), got {type(relation).__name__}."
            )
        idx = np.asarray(index)
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(
                f"`index` must be a 1-d sequence of integers, got {index!r}."
            )
        if not (isinstance(dim, (int, np.integer)) and dim >= 1):
            raise ValueError(f"`dim` must be a positive integer, got {dim!r}.")
        if idx.size and (idx.min() < 0 or idx.max() >= dim):
            raise ValueError(
                f"`index` {idx.tolist()} exceeds the joint state of dimension {dim}: "
                f"every index must lie in [0, {dim})."
            )
        if len(set(idx.tolist())) != idx.size:
            raise ValueError(f"`index` {idx.tolist()} repeats a coordinate.")
        if idx.size != relation.dim:
            raise ValueError(
                f"`index` has {idx.size} coordinates but the relation has dimension "
                f"{relation.dim}."
            )
        self.relation = relation
        self.index = tuple(int(i) for i in idx)
        self.joint_dim = int(dim)

    @property
    def dim(self) -> int:
        return self.joint_dim

    def restrict(self, z: Float[Array, " n"]) -> Float[Array, " m"]:
        """The member's coordinates $Pz$ of a joint state."""
        return z[np.asarray(self.index)]

    def prior_field(self, z: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
        r"""$P^\top g(Pz)$: the member's field scattered into the joint state."""
        z = self.check_point("z", z)
        g = self.relation.prior_field(self.restrict(z))
        return jnp.zeros_like(z).at[np.asarray(self.index)].set(g.astype(z.dtype))

    @property
    def conservative(self) -> bool:
        return self.relation.conservative

    def energy(self, z: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        """The member's potential at its coordinates."""
        z = self.check_point("z", z)
        return self.relation.energy(self.restrict(z))

    def effective_lambda(self, dtype) -> Float[Array, ""]:
        return self.relation.effective_lambda(dtype)

    def belief_precision(self, z: Float[ArrayLike, " n"]) -> Float[Array, "n n"]:
        """The member's belief precision on its coordinates, 0 elsewhere."""
        z = self.check_point("z", z)
        idx = np.asarray(self.index)
        block = self.relation.belief_precision(self.restrict(z)).astype(z.dtype)
        full = jnp.zeros((z.shape[0], z.shape[0]), z.dtype)
        return full.at[np.ix_(idx, idx)].set(block)

    def field_unit(self, dtype) -> Float[Array, " n"]:
        """The member's unit on its coordinates, 0 (no field) elsewhere."""
        unit = self.relation.field_unit(dtype)
        return jnp.zeros((self.dim,), dtype).at[np.asarray(self.index)].set(unit)

    def support_ratio(
        self, z: Float[Array, " n"], clamped: Bool[Array, " n"]
    ) -> Float[Array, ""]:
        """The member's test on its coordinates (clamps elsewhere do not
        touch it)."""
        idx = np.asarray(self.index)
        return self.relation.support_ratio(z[idx], clamped[idx])


def named_relation(
    relation: AbstractImplicitRelation,
    variables: Sequence[str],
    blocks: Mapping[str, int],
) -> IndexedRelation:
    """A relation over named variable blocks of a joint state.

    **Arguments:**

    - `relation`: the member relation; its coordinates are the `variables`'
      blocks, concatenated in the order given.
    - `variables`: the names of the variables it relates.
    - `blocks`: the joint state's variables and sizes, as in
      [`retrax.relations.blockranges`][].

    **Returns:**

    An [`retrax.relations.IndexedRelation`][].
    """
    ranges = blockranges(blocks)
    missing = [v for v in variables if v not in ranges]
    if missing:
        raise ValueError(
            f"variables {missing} are not in the joint state's blocks {list(ranges)}."
        )
    index = [i for v in variables for i in ranges[v]]
    n = sum(len(r) for r in ranges.values())
    return IndexedRelation(relation, index, n)


class ProductRelation(AbstractImplicitRelation):
    r"""The weighted product of relations over one joint state.

    The field is $g(z) = \sum_i w_i g_i(z)$: for members that approximate
    $\lambda(-\nabla\log p_i)$ it approximates $\lambda(-\nabla\log\prod_i
    p_i^{w_i})$, so the product's answers satisfy every relation at once
    (a factor graph whose factors are relations). Members usually are
    [`retrax.relations.IndexedRelation`][]s, each touching only its own
    coordinates. Derivatives through [`retrax.relations.implicit_infer`][]
    reach the parameters of every member (and the weights).

    **Arguments:**

    - `relations`: the members, all of the same joint dimension.
    - `weights`: one nonnegative weight per member; all 1 by default.
    """

    relations: tuple[AbstractImplicitRelation, ...]
    weights: Float[Array, " m"]

    def __init__(
        self,
        relations: Sequence[AbstractImplicitRelation],
        weights: Float[ArrayLike, " m"] | Sequence[float] | None = None,
    ):
        relations = tuple(relations)
        if not relations:
            raise ValueError("`relations` must hold at least one relation.")
        for r in relations:
            if not isinstance(r, AbstractImplicitRelation):
                raise TypeError(
                    "every member must be an AbstractImplicitRelation (e.g. an "
                    f"IndexedRelation), got {type(r).__name__}."
                )
        dims = {r.dim for r in relations}
        if len(dims) != 1:
            raise ValueError(
                f"the relations have different joint dimensions {sorted(dims)}: "
                "place each on the joint state with `IndexedRelation` or "
                "`named_relation`."
            )
        if weights is None:
            weights = np.ones(len(relations))
        if np.shape(weights) != (len(relations),):
            raise ValueError(
                f"`weights` must hold one weight per relation ({len(relations)}),"
                f" got shape {np.shape(weights)}."
            )
        weights = check_value(
            weights,
            lambda xp, v: ~(v >= 0) | ~xp.isfinite(v),
            "`weights` must be finite and nonnegative.",
        )
        weights = jnp.asarray(weights)
        if not jnp.issubdtype(weights.dtype, jnp.inexact):
            weights = weights.astype(jnp.result_type(float))
        self.relations = relations
        self.weights = weights

    @property
    def dim(self) -> int:
        return self.relations[0].dim

    def prior_field(self, z: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
        r"""$\sum_i w_i g_i(z)$."""
        z = self.check_point("z", z)
        w = self.weights.astype(z.dtype)
        total = jnp.zeros_like(z)
        for i, r in enumerate(self.relations):
            total = total + w[i] * r.prior_field(z).astype(z.dtype)
        return total

    @property
    def conservative(self) -> bool:
        return all(r.conservative for r in self.relations)

    def energy(self, z: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        r"""$\sum_i w_i U_i(z)$, for products of conservative relations."""
        z = self.check_point("z", z)
        if not self.conservative:
            raise TypeError(
                "this ProductRelation has no known potential: `energy` needs every "
                "member to be conservative (GaussianMixtureEps or EnergyNetwork "
                "predictors, or products and restrictions of those)."
            )
        w = self.weights.astype(z.dtype)
        return sum(w[i] * r.energy(z) for i, r in enumerate(self.relations))

    def field_unit(self, dtype) -> Float[Array, " n"]:
        r"""$\sum_i w_i u_i$ of the members' units $u_i$, per coordinate."""
        w = self.weights.astype(dtype)
        return sum(w[i] * r.field_unit(dtype) for i, r in enumerate(self.relations))

    def support_ratio(
        self, z: Float[Array, " n"], clamped: Bool[Array, " n"]
    ) -> Float[Array, ""]:
        """The largest of the members' ratios: NaN when a member with clamps on
        its coordinates is not calibrated for them."""
        ratios = jnp.stack([r.support_ratio(z, clamped) for r in self.relations])
        return jnp.max(ratios)

    def belief_precision(self, z: Float[ArrayLike, " n"]) -> Float[Array, "n n"]:
        r"""$\sum_i w_i P_i(z)$ of the members' belief precisions (each
        deblurred if its relation is), on the common scale
        $\lambda_{\mathrm{eff}}$."""
        z = self.check_point("z", z)
        lam = self.effective_lambda(z.dtype)
        w = self.weights.astype(z.dtype)
        total = jnp.zeros((z.shape[0], z.shape[0]), z.dtype)
        for i, r in enumerate(self.relations):
            scale = w[i] * r.effective_lambda(z.dtype) / lam
            total = total + scale * r.belief_precision(z).astype(z.dtype)
        return total

    def effective_lambda(self, dtype) -> Float[Array, ""]:
        r"""The members' common $\lambda_{\mathrm{eff}}$ (an error, under `jit`
        too, when they differ: the product is then not a scaled density)."""
        lams = jnp.stack([r.effective_lambda(dtype) for r in self.relations])
        return error_if(
            lams[0],
            jnp.any(jnp.abs(lams - lams[0]) > 1e-6 * jnp.abs(lams[0])),
            "the members of a ProductRelation have different effective field "
            "scales; build each with `lam = density_lambda(schedule, nodes)` for a "
            "Laplace covariance of the product.",
        )
