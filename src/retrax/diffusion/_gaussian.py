"""Gaussian beliefs in moment and canonical (information) form: conversion,
marginalisation onto chosen coordinates, products and quotients."""

import abc
from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float


def as_coords(coords: Sequence[int] | ArrayLike, dim: int) -> np.ndarray:
    """Checked coordinates: distinct integers in `[0, dim)`, as a numpy index."""
    idx = np.asarray(coords)
    if idx.ndim != 1 or not (idx.size == 0 or np.issubdtype(idx.dtype, np.integer)):
        raise ValueError(
            f"`coords` must be a 1-d sequence of integers, got {coords!r}."
        )
    if idx.size == 0:
        raise ValueError("`coords` must name at least one coordinate.")
    if idx.min() < 0 or idx.max() >= dim:
        raise ValueError(
            f"`coords` {idx.tolist()} must lie in [0, {dim}) (the belief's dimension)."
        )
    if len(set(idx.tolist())) != idx.size:
        raise ValueError(f"`coords` {idx.tolist()} repeats a coordinate.")
    return idx


class AbstractGaussian(eqx.Module):
    """A Gaussian belief over `dim` coordinates, in some parametrisation.

    Every form converts to the others ([`retrax.diffusion.MomentGaussian`][]
    by `moment`, [`retrax.diffusion.CanonicalGaussian`][] by `canonical`) and
    marginalises onto chosen coordinates (`marginal`).
    """

    @property
    @abc.abstractmethod
    def dim(self) -> int:
        """The number of coordinates."""

    @abc.abstractmethod
    def moment(self) -> "MomentGaussian":
        """The belief in moment form (mean and covariance)."""

    @abc.abstractmethod
    def canonical(self) -> "CanonicalGaussian":
        """The belief in canonical form (information vector and precision)."""

    @abc.abstractmethod
    def marginal(self, coords: Sequence[int] | ArrayLike) -> "AbstractGaussian":
        """The marginal belief over `coords` (in their order), in the same form."""


class MomentGaussian(AbstractGaussian):
    r"""A Gaussian $N(\mu, \Sigma)$ in moment form.

    Marginalising selects: the marginal over coordinates $a$ is
    $N(\mu_a, \Sigma_{aa})$.

    **Arguments:**

    - `mean`: $\mu$, shape `(n,)`.
    - `cov`: $\Sigma$, shape `(n, n)`, symmetric positive semidefinite.
    """

    mean: Float[Array, " n"]
    cov: Float[Array, "n n"]

    def __check_init__(self):
        n = self.mean.shape
        if len(n) != 1 or self.cov.shape != n * 2:
            raise ValueError(
                "`mean` must have shape (n,) and `cov` shape (n, n), got "
                f"{self.mean.shape} and {self.cov.shape}."
            )

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    def moment(self) -> "MomentGaussian":
        return self

    def canonical(self) -> "CanonicalGaussian":
        r"""$\Lambda = \Sigma^{-1}$, $\eta = \Lambda\mu$ (NaN for a singular
        $\Sigma$, such as a clamped coordinate's zero variance)."""
        precision = jnp.linalg.inv(self.cov)
        precision = 0.5 * (precision + precision.T)
        return CanonicalGaussian(info=precision @ self.mean, precision=precision)

    def marginal(self, coords: Sequence[int] | ArrayLike) -> "MomentGaussian":
        idx = as_coords(coords, self.dim)
        return MomentGaussian(mean=self.mean[idx], cov=self.cov[np.ix_(idx, idx)])


class CanonicalGaussian(AbstractGaussian):
    r"""A Gaussian in canonical (information) form, $\propto
    \exp(\eta^\top z - \tfrac12 z^\top\Lambda z)$.

    Products of Gaussians add their canonical parameters
    ([`retrax.diffusion.combine`][]), quotients subtract them
    ([`retrax.diffusion.divide`][]); $\Lambda$ may be singular or indefinite
    (a likelihood that says nothing about some direction, or a quotient),
    where the moment form does not exist. Marginalising over coordinates
    $a$ (out of $b$) is the Schur complement:
    $\Lambda_{aa} - \Lambda_{ab}\Lambda_{bb}^{-1}\Lambda_{ba}$,
    $\eta_a - \Lambda_{ab}\Lambda_{bb}^{-1}\eta_b$.

    **Arguments:**

    - `info`: the information vector $\eta$, shape `(n,)`.
    - `precision`: the precision $\Lambda$, shape `(n, n)`, symmetric.
    """

    info: Float[Array, " n"]
    precision: Float[Array, "n n"]

    def __check_init__(self):
        n = self.info.shape
        if len(n) != 1 or self.precision.shape != n * 2:
            raise ValueError(
                "`info` must have shape (n,) and `precision` shape (n, n), got "
                f"{self.info.shape} and {self.precision.shape}."
            )

    @property
    def dim(self) -> int:
        return self.info.shape[0]

    def moment(self) -> MomentGaussian:
        r"""$\Sigma = \Lambda^{-1}$, $\mu = \Sigma\eta$ (NaN unless $\Lambda$ is
        invertible)."""
        cov = jnp.linalg.inv(self.precision)
        cov = 0.5 * (cov + cov.T)
        return MomentGaussian(mean=cov @ self.info, cov=cov)

    def canonical(self) -> "CanonicalGaussian":
        return self

    def marginal(self, coords: Sequence[int] | ArrayLike) -> "CanonicalGaussian":
        idx = as_coords(coords, self.dim)
        rest = np.setdiff1d(np.arange(self.dim), idx)
        p = self.precision
        p_aa, h_a = p[np.ix_(idx, idx)], self.info[idx]
        if rest.size == 0:
            return CanonicalGaussian(info=h_a, precision=p_aa)
        p_ab, p_bb = p[np.ix_(idx, rest)], p[np.ix_(rest, rest)]
        solved = jnp.linalg.solve(
            p_bb, jnp.concatenate([p_ab.T, self.info[rest][:, None]], axis=1)
        )
        precision = p_aa - p_ab @ solved[:, :-1]
        precision = 0.5 * (precision + precision.T)
        return CanonicalGaussian(info=h_a - p_ab @ solved[:, -1], precision=precision)


def _same_dim(beliefs: Sequence[AbstractGaussian]) -> None:
    for b in beliefs:
        if not isinstance(b, AbstractGaussian):
            raise TypeError(
                "every belief must be a Gaussian (MomentGaussian, CanonicalGaussian "
                f"or LaplaceBelief), got {type(b).__name__}."
            )
    dims = {b.dim for b in beliefs}
    if len(dims) != 1:
        raise ValueError(
            f"the beliefs have different dimensions {sorted(dims)}; marginalise "
            "them onto the same coordinates first."
        )


def combine(*beliefs: AbstractGaussian) -> CanonicalGaussian:
    r"""The product of Gaussian beliefs over the same coordinates.

    $\prod_i N_i \propto$ the canonical Gaussian with $\eta = \sum_i\eta_i$
    and $\Lambda = \sum_i\Lambda_i$ (the normalising constant is dropped).

    **Arguments:**

    - `*beliefs`: one or more Gaussians of the same dimension, in any form.

    **Returns:**

    Their product, a [`retrax.diffusion.CanonicalGaussian`][].
    """
    if not beliefs:
        raise ValueError("`combine` needs at least one belief.")
    _same_dim(beliefs)
    forms = [b.canonical() for b in beliefs]
    return CanonicalGaussian(
        info=sum(f.info for f in forms), precision=sum(f.precision for f in forms)
    )


def divide(belief: AbstractGaussian, by: AbstractGaussian) -> CanonicalGaussian:
    r"""The quotient of two Gaussian beliefs: $\eta_1 - \eta_2$,
    $\Lambda_1 - \Lambda_2$ (a message with an incoming one divided out).

    **Arguments:**

    - `belief`: the numerator.
    - `by`: the denominator, of the same dimension.

    **Returns:**

    The quotient, a [`retrax.diffusion.CanonicalGaussian`][] (its precision
    need not be positive definite).
    """
    _same_dim([belief, by])
    a, b = belief.canonical(), by.canonical()
    return CanonicalGaussian(info=a.info - b.info, precision=a.precision - b.precision)
