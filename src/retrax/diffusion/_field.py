"""The implicit field of a noise predictor, and the clamped residual of a query."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float

from .._misc import check_value
from ._energy import EnergyNetwork
from ._mixture import GaussianMixtureEps
from ._nodes import FieldNodes, density_lambda
from ._predictor import AbstractPredictor, as_state


def clamp_mask(rho: Float[Array, " n"]) -> Bool[Array, " n"]:
    """The hard-clamped coordinates: those with an infinite stiffness."""
    return jnp.isposinf(rho)


def soft_stiffness(rho: Float[Array, " n"]) -> Float[Array, " n"]:
    r"""$\rho_i^2$ on the non-clamped coordinates and 0 on clamped ones.

    The `where` selects before squaring, so an infinite $\rho$ never meets a
    zero (no `inf * 0`) and its derivative is exactly 0.
    """
    safe = jnp.where(clamp_mask(rho), jnp.zeros_like(rho), rho)
    return safe * safe


class AbstractImplicitRelation(eqx.Module):
    r"""A relation over a joint space: a field whose stable roots are its answers.

    The interface [`retrax.diffusion.implicit_infer`][] and the other query
    functions need: the joint dimension `dim`, the prior field
    $g(z)$ (`prior_field`) and its Jacobian (`prior_jacobian`, one
    `jax.jacfwd` by default). A query's residual
    ([`retrax.diffusion.AbstractImplicitRelation.implicit_residual`][]) is
    built from the field alone.

    Optional structure: a relation whose field is the gradient of a known
    potential $U$ sets `conservative = True` and defines `energy`
    ($\nabla U = g$); its Jacobian is then symmetric, which
    `implicit_infer` uses for the adjoint solve. `effective_lambda` is the
    scale of the field against $-\nabla\log p$ (used by the Laplace
    covariance).

    Implementations: [`retrax.diffusion.ImplicitDiffusion`][] (a noise
    predictor), [`retrax.diffusion.IndexedRelation`][] (a relation over some
    coordinates of a larger joint state) and
    [`retrax.diffusion.ProductRelation`][] (a weighted sum of relations).
    """

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """The joint dimension $n$."""

    @abc.abstractmethod
    def prior_field(self, z: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
        """The prior field $g(z)$, shape `(n,)`, typed like `z`."""

    @property
    def conservative(self) -> bool:
        """Whether the field is the gradient of `energy` (False by default)."""
        return False

    def energy(self, z: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        r"""The potential $U$ with $\nabla U = g$, for conservative relations."""
        raise TypeError(
            f"{type(self).__name__} has no known potential: `energy` needs a "
            "conservative relation (a GaussianMixtureEps or EnergyNetwork "
            "predictor, or products and restrictions of those)."
        )

    def effective_lambda(self, dtype) -> Float[Array, ""]:
        r"""The scale $\lambda_{\mathrm{eff}}$ of the field against
        $-\nabla\log p$ (1 when not known)."""
        return jnp.ones((), dtype)

    def field_unit(self, dtype) -> Float[Array, " n"]:
        r"""Per coordinate, the size of the field one noise standard deviation
        off the data: the unit of a query's clamp load (see
        [`retrax.diffusion.ImplicitSolution`][]). NaN when not known (then no
        query is flagged off the data); 0 where the relation has no field."""
        return jnp.full((self.dim,), jnp.nan, dtype)

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

    def implicit_residual(
        self,
        z: Float[ArrayLike, " n"],
        z0: Float[ArrayLike, " n"],
        rho: Float[ArrayLike, " n"],
    ) -> Float[Array, " n"]:
        r"""The residual of a query, whose roots are the query's answers.

        With stiffness $\rho_i$ (an inverse standard deviation):
        $\rho_i = \infty$ clamps $z_i = z_{0,i}$ (row $z_i - z_{0,i}$), a large
        finite $\rho_i$ is a soft input, a small one an anchor that selects a
        branch, and $\rho_i = 0$ leaves $z_i$ free. On the non-clamped
        coordinates $F$ the residual is $g(z) + \rho^2 (z - z_0)$. The clamp
        pattern is data: every query has the same `n`-vector residual, so
        queries with different patterns share one compiled program and one
        `vmap`.

        **Arguments:**

        - `z`: the point, shape `(n,)`.
        - `z0`: the query values, shape `(n,)`.
        - `rho`: the stiffnesses, shape `(n,)`, in $[0, \infty]$.

        **Returns:**

        The residual, shape `(n,)`.
        """
        z = self.check_point("z", z)
        z0 = self.check_point("z0", z0).astype(z.dtype)
        rho = self.check_point("rho", rho).astype(z.dtype)
        clamped = clamp_mask(rho)
        diff = z - z0
        free_rows = self.prior_field(z) + soft_stiffness(rho) * diff
        return jnp.where(clamped, diff, free_rows)


class ImplicitDiffusion(AbstractImplicitRelation):
    r"""A noise predictor used as a relation: the implicit field and its queries.

    The prior field over the joint space is

    $g(z) = \sum_k w_k \lambda_k\,(\hat\epsilon(\alpha_k z + \sigma_k e_k, t_k)
    - e_k)$, $\lambda_k = \lambda\,\sigma_k/\alpha_k$

    (the RED-Diff weighting of Mardani et al., "A variational perspective on
    solving inverse problems with diffusion models", ICLR 2024), over the
    fixed [`retrax.diffusion.FieldNodes`][] $(t_k, e_k, w_k)$. For the exact
    predictor of a density $p$ it approximates
    $\lambda\sum_k w_k\sigma_k^2/\alpha_k^2\,(-\nabla\log p)$: its stable roots
    are the modes. All $K$ nodes are evaluated in one `vmap`ped call of the
    predictor, and the Jacobian is one `jax.jacfwd` of that call.

    A query clamps some coordinates and solves for the others:
    see [`retrax.diffusion.AbstractImplicitRelation.implicit_residual`][] and
    [`retrax.diffusion.implicit_infer`][].

    **Arguments:**

    - `pred`: the noise predictor.
    - `nodes`: the field nodes; their dimension is the joint dimension $n$.
    - `lam`: the global field weight $\lambda$ (see
      [`retrax.diffusion.density_lambda`][] for a data-unit choice).
    """

    pred: AbstractPredictor
    nodes: FieldNodes
    lam: float | Float[Array, ""]

    def __init__(
        self,
        pred: AbstractPredictor,
        nodes: FieldNodes,
        lam: float | Float[ArrayLike, ""] = 1.0,
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
        try:
            jax.eval_shape(
                pred.epsilon,
                jax.ShapeDtypeStruct((n,), nodes.eps.dtype),
                jax.ShapeDtypeStruct((), nodes.t.dtype),
            )
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"`nodes` have dimension {n}, but `pred` cannot take a point of "
                f"shape ({n},): {err} Build the nodes for the predictor's "
                "dimension, e.g. `field_nodes(key, n)`."
            ) from err
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
        # Adding a zero stages `t` into any enclosing trace: the schedule's time
        # check branches on `isinstance(t, Tracer)`, and a concrete `t` closed over
        # by a jitted function would otherwise be checked with `bool()` on a tracer.
        t = self.nodes.t.astype(dtype) + jnp.zeros((), dtype)
        e = self.nodes.eps.astype(dtype)
        w = self.nodes.w.astype(dtype)
        schedule = self.pred.schedule
        alpha = schedule.alpha(t).astype(dtype)
        sigma = schedule.sigma(t).astype(dtype)
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
        """Whether the predictor has a known potential (a `GaussianMixtureEps` or
        an `EnergyNetwork`), so that the field is a gradient."""
        return isinstance(self.pred, (GaussianMixtureEps, EnergyNetwork))

    def energy(self, z: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        r"""The potential $U$ of the field, $\nabla U = g$ (up to a constant).

        With $x_k = \alpha_k z + \sigma_k e_k$ and $E_k = -\log p_{t_k}$ (a
        mixture, $\hat\epsilon = -\sigma_t\nabla_x\log p_t$) or the network's
        energy ($\hat\epsilon = \sigma_t\nabla_x E$):
        $U(z) = \sum_k w_k\lambda_k(\sigma_k/\alpha_k)\,E_k(x_k) -
        (\sum_k w_k\lambda_k e_k)^\top z$.

        **Arguments:**

        - `z`: a point of the joint space, shape `(n,)`.

        **Returns:**

        The scalar potential.
        """
        if not self.conservative:
            return super().energy(z)
        z = self.check_point("z", z)
        t, e, x, alpha, sigma, coef = self._at_nodes(z)
        if isinstance(self.pred, GaussianMixtureEps):
            energy = jax.vmap(lambda a, b: -self.pred.logdensity(a, b))(x, t)
        else:
            energy = jax.vmap(self.pred.energy)(x, t)
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
