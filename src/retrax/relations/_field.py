"""The implicit field of a noise predictor."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._validate import check_value
from ..diffusion import AbstractPredictor
from ._abstract_relation import AbstractImplicitRelation, laplace_precision
from ._deblur import deblurred_precision, node_levels
from ._nodes import FieldNodes, density_lambda
from ._support import DataSupport


# A deblurred belief's variance along a direction is at least this fraction
# of the measured one's inverse: no direction sharpens more than tenfold.
_MAX_SHARPENING = 10.0


# What JAX raises when a function reads a traced array's value in Python (an
# `if` on an array, `float(x)`, `np.asarray(x)`): not a shape mismatch.
_TRACER_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.UnexpectedTracerError,
)


def _check_point_shape(pred: AbstractPredictor, nodes: FieldNodes) -> None:
    """That `pred` takes a point of the nodes' dimension, found by tracing it
    abstractly; an error with the predictor's own exception otherwise.

    The function traced is a new closure, not the bound method
    `pred.epsilon`: JAX compares a function with those it has traced before,
    and comparing bound methods compares their modules, which for a module
    whose leaves are tracers (a relation built inside `jit` or `grad`) asks
    for the truth value of a traced array.
    """
    n = nodes.dim
    x = jax.ShapeDtypeStruct((n,), nodes.eps.dtype)
    t = jax.ShapeDtypeStruct((), nodes.t.dtype)
    try:
        jax.eval_shape(lambda x, t: pred.epsilon(x, t), x, t)
    except _TRACER_ERRORS as err:
        raise TypeError(
            f"`pred` cannot be traced at a point of shape ({n},): its model reads "
            "the value of an array in Python (an `if` on an array, `float(x)`, "
            "`np.asarray(x)`), which has none while it is traced. Use `jnp.where` "
            f"or `jax.lax.cond` in the model. {type(err).__name__}: {err}"
        ) from err
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"`nodes` have dimension {n}, but `pred` cannot take a point of "
            f"shape ({n},): {type(err).__name__}: {err} Build the nodes for the "
            "predictor's dimension, e.g. `field_nodes(key, n)`."
        ) from err


class ImplicitDiffusion(AbstractImplicitRelation):
    r"""A noise predictor used as a relation: the implicit field and its queries.

    The prior field over the joint space is

    $g(z) = \sum_k w_k \lambda_k\,(\hat\epsilon(\alpha_k z + \sigma_k e_k, t_k)
    - e_k)$, $\lambda_k = \lambda\,\sigma_k/\alpha_k$

    (the RED-Diff weighting of Mardani et al., "A variational perspective on
    solving inverse problems with diffusion models", ICLR 2024), over the
    fixed [`retrax.relations.FieldNodes`][] $(t_k, e_k, w_k)$. For the exact
    predictor of a density $p$ it approximates
    $\lambda\sum_k w_k\sigma_k^2/\alpha_k^2\,(-\nabla\log p)$: its stable roots
    are the modes. All $K$ nodes are evaluated in one `vmap`ped call of the
    predictor, and the Jacobian is one `jax.jacfwd` of that call.

    A query clamps some coordinates and solves for the others:
    see [`retrax.relations.AbstractImplicitRelation.implicit_residual`][] and
    [`retrax.relations.implicit_infer`][].

    **Arguments:**

    - `pred`: the noise predictor.
    - `nodes`: the field nodes; their dimension is the joint dimension $n$.
    - `lam`: the global field weight $\lambda$ (see
      [`retrax.relations.density_lambda`][] for a data-unit choice).
    - `support`: the training rows of the calibrated off-data test, or
      `None` (not calibrated); set by
      [`retrax.relations.calibrate_off_data`][].
    - `deblur`: whether the relation's Laplace beliefs (its
      `belief_precision`, and so [`retrax.relations.implicit_laplace`][],
      the beliefs and factor messages built on it, and a factor graph's
      `graph_laplace` and `propagate_beliefs`) remove the smoothing
      of the nodes' own noise levels. At level $r_k = \sigma_k/\alpha_k$
      the field reads the data smoothed by $r_k$, which widens a belief
      about a relation thinner than the noise at the schedule's `t_min` (see
      [`retrax.relations.belief_levels`][]): along each eigenvector of the
      precision with curvature $p > 0$, the variance becomes the $v$ with
      $\sum_k c_k/(v + r_k^2) = p$ ($c_k = w_k r_k^2/\sum_j w_j r_j^2$; for
      one level, $v = 1/p - r^2$), exact for locally Gaussian data, and never
      below a tenth of $1/p$ (a network sharper than its own noise is not
      sharpened further). Directions of zero or negative curvature are kept.
      Answers and their derivatives do not change; the deblurred beliefs
      are differentiable, also where eigenvalues repeat. Default `False`.
    """

    pred: AbstractPredictor
    nodes: FieldNodes
    lam: float | Float[Array, ""]
    support: DataSupport | None
    deblur: bool = eqx.field(static=True)

    def __init__(
        self,
        pred: AbstractPredictor,
        nodes: FieldNodes,
        lam: float | Float[ArrayLike, ""] = 1.0,
        support: DataSupport | None = None,
        *,
        deblur: bool = False,
    ):
        if not isinstance(pred, AbstractPredictor):
            raise TypeError(
                "`pred` must be a noise predictor (an AbstractPredictor such as "
                f"NoisePredictor or GaussianMixtureEps), got {type(pred)}."
            )
        if not isinstance(nodes, FieldNodes):
            raise TypeError(
                f"`nodes` must be FieldNodes (see `field_nodes`), got {type(nodes)}."
            )
        n = nodes.dim
        _check_point_shape(pred, nodes)
        if np.shape(lam) != ():
            raise ValueError(
                f"`lam` must be a scalar field weight, got shape {np.shape(lam)}."
            )
        self.pred = pred
        self.nodes = nodes
        self.lam = check_value(
            lam,
            lambda xp, v: ~(v >= 0) | ~xp.isfinite(v),
            "`lam` must be a finite, nonnegative field weight (see "
            "`density_lambda` for a data-unit choice).",
        )
        if support is not None:
            if not isinstance(support, DataSupport):
                raise TypeError(
                    "`support` must be a DataSupport (see `calibrate_off_data`) or "
                    f"None, got {type(support).__name__}."
                )
            if support.points.ndim != 2 or support.points.shape[1] != n:
                raise ValueError(
                    f"`support` holds rows of shape {support.points.shape[1:]}, "
                    f"but the relation's joint dimension is {n}."
                )
        self.support = support
        if not isinstance(deblur, bool):
            raise TypeError(f"`deblur` must be True or False, got {deblur!r}.")
        self.deblur = deblur

    @property
    def dim(self) -> int:
        """The joint dimension $n$ (that of the nodes)."""
        return self.nodes.dim

    def _at_nodes(self, z: Float[Array, " n"]) -> tuple[Float[Array, "..."], ...]:
        r"""A checked point `z` noised at every node, for the field and its potential.

        Returns `(t, e, x, alpha, sigma, coef)`, all typed like `z`: the node
        times $t_k$ and noises $e_k$, the noised points
        $x_k = \alpha_k z + \sigma_k e_k$ of shape `(K, n)`, $\alpha_k$,
        $\sigma_k$, and the node weights $w_k\lambda\sigma_k/\alpha_k$.
        """
        dtype = z.dtype
        t = self.nodes.t.astype(dtype)
        e = self.nodes.eps.astype(dtype)
        w = self.nodes.w.astype(dtype)
        # The nodes' times were checked when the nodes were built (`FieldNodes`):
        # the schedule's unchecked formulas stage no check per field evaluation.
        schedule = self.pred.schedule
        alpha = schedule._alpha(t).astype(dtype)
        sigma = schedule._sigma(t).astype(dtype)
        x = alpha[:, None] * z[None, :] + sigma[:, None] * e
        coef = w * jnp.asarray(self.lam).astype(dtype) * sigma / alpha
        return t, e, x, alpha, sigma, coef

    def prior_field(self, z: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
        r"""The prior field $g(z)$.

        **Arguments:**

        - `z`: a point of the joint space, shape `(n,)`.

        **Returns:**

        $g(z)$, shape `(n,)`, typed like `z`.
        """
        z = self.check_point("z", z)
        t, e, x, _, _, coef = self._at_nodes(z)
        eps = jax.vmap(self.pred.epsilon)(x, t)
        return coef @ (eps - e)

    @property
    def conservative(self) -> bool:
        """Whether the predictor is conservative (it has a known potential, as a
        `GaussianMixtureEps` or an `EnergyNetwork` has), so that the field is a
        gradient."""
        return self.pred.conservative

    def energy(self, z: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        r"""The potential $U$ of the field, $\nabla U = g$ (up to a constant).

        With $x_k = \alpha_k z + \sigma_k e_k$ and $E_k$ the predictor's
        potential at $t_k$ (`pred.potential`, $\hat\epsilon = \sigma_t
        \nabla_x E$: $-\log p_{t_k}$ for a mixture, the network's energy for
        an energy network):
        $U(z) = \sum_k w_k\lambda_k(\sigma_k/\alpha_k)\,E_k(x_k) -
        (\sum_k w_k\lambda_k e_k)^\top z$.

        **Arguments:**

        - `z`: a point of the joint space, shape `(n,)`.

        **Returns:**

        The scalar potential.
        """
        if not self.conservative:
            raise TypeError(
                f"ImplicitDiffusion of {type(self.pred).__name__} has no known "
                "potential: `energy` needs a conservative predictor (a "
                "GaussianMixtureEps or an EnergyNetwork)."
            )
        z = self.check_point("z", z)
        t, e, x, alpha, sigma, coef = self._at_nodes(z)
        energy = jax.vmap(self.pred.potential)(x, t)
        return jnp.dot(coef * sigma / alpha, energy) - jnp.dot(coef @ e, z)

    def field_unit(self, dtype) -> Float[Array, " n"]:
        r"""$\lambda s$ on every coordinate, with the nodes' mean noise level
        $s^2 = \sum_k w_k\sigma_k^2/\alpha_k^2$: the field is about
        $\lambda s^2(-\nabla\log p)$, and a point $d$ off a smoothed data
        set has $|\nabla\log p| \approx d/s^2$."""
        lam = jnp.asarray(self.lam).astype(dtype)
        level = jnp.sqrt(1 / density_lambda(self.pred.schedule, self.nodes))
        return jnp.full((self.dim,), lam * level.astype(dtype), dtype)

    def effective_lambda(self, dtype) -> Float[Array, ""]:
        r"""`lam * sum_k w_k sigma_k^2 / alpha_k^2`: the field's scale against
        $-\nabla\log p$ (1 with `lam = density_lambda(schedule, nodes)`)."""
        lam = jnp.asarray(self.lam).astype(dtype)
        return lam / density_lambda(self.pred.schedule, self.nodes).astype(dtype)

    def belief_precision(self, z: Float[ArrayLike, " n"]) -> Float[Array, "n n"]:
        r"""$\mathrm{sym}(J)/\lambda_{\mathrm{eff}}$, with the nodes' smoothing
        removed when the relation was built with `deblur=True`."""
        precision = laplace_precision(self, z)
        if not self.deblur:
            return precision
        r2, c = node_levels(self.pred.schedule, self.nodes, precision.dtype)
        return deblurred_precision(precision, r2, c, _MAX_SHARPENING)

    def support_ratio(
        self, z: Float[Array, " n"], clamped: Bool[Array, " n"]
    ) -> Float[Array, ""]:
        """The test of `support` (see `DataSupport.ratio`); without it, NaN
        for a query with clamps and 0 for one without."""
        if self.support is None:
            return jnp.where(jnp.any(clamped), jnp.asarray(jnp.nan, z.dtype), 0)
        return self.support.ratio(z, clamped)
