"""Gaussian beliefs in moment and canonical (information) form: conversion,
marginalisation onto chosen coordinates, products and quotients."""

import abc
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
from jaxtyping import Array, ArrayLike, Bool, Float, Shaped

from .._errors import error_if
from .._never_silent import nan_unless
from .._state import as_state


def as_coords(coords: Sequence[int] | ArrayLike, dim: int) -> np.ndarray:
    """Checked coordinates: distinct integers in `[0, dim)`, as a numpy index.

    They fix the marginal's shape, so they are static: a traced value (an
    argument of a `jit`-transformed function) raises a `TypeError` saying so.
    """
    traced = isinstance(coords, jax.core.Tracer) or (
        isinstance(coords, (list, tuple))
        and any(isinstance(c, jax.core.Tracer) for c in coords)
    )
    if traced:
        raise TypeError(
            "`coords` must be concrete: they fix the marginal's shape when the "
            "program is traced. Pass a tuple of Python ints (close over it, or "
            "mark it static in `jax.jit`), not a traced array."
        )
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


def _square_checked(name: str, matrix: Array, psd: bool) -> Array:
    r"""`matrix` checked symmetric (and, with `psd`, positive semidefinite);
    a stack of matrices `(..., n, n)` is checked matrix by matrix, in one
    vectorised check.

    Relative to the dtype's precision: an asymmetry or a negative eigenvalue
    beyond $\sqrt{\epsilon}$ times the largest entry or eigenvalue of its
    matrix (rounding in a computed matrix stays far below that). A concrete
    `matrix` raises a `ValueError` at once; a traced one (built under `jit`)
    is checked at run time, with the same message. NaN passes: it is the
    documented result of a failed solve.
    """
    what = "symmetric positive semidefinite" if psd else "symmetric"
    msg = f"`{name}` must be {what}"
    if matrix.size == 0:
        return matrix
    if isinstance(matrix, jax.core.Tracer):
        xp, value = jnp, jax.lax.stop_gradient(matrix)
    else:
        xp, value = np, np.asarray(matrix)
    tol = float(np.sqrt(np.finfo(value.dtype).eps))
    last = (-2, -1)
    transpose = xp.swapaxes(value, -1, -2)
    scale = xp.max(xp.abs(value), axis=last)
    asym = xp.max(xp.abs(value - transpose), axis=last)
    bad_sym = xp.any(asym > tol * scale)
    bad_psd = False
    if psd:
        # non-finite entries are not this check's business (and LAPACK's
        # eigensolver may refuse them)
        finite = xp.all(xp.isfinite(value), axis=last)
        eye = xp.eye(value.shape[-1], dtype=value.dtype)
        sym = xp.where(finite[..., None, None], 0.5 * (value + transpose), eye)
        vals = xp.linalg.eigvalsh(sym)
        top = xp.max(xp.abs(vals), axis=-1)
        negative = finite & (vals[..., 0] < -tol * top)
        bad_psd = xp.any(negative)
    if xp is jnp:
        matrix = error_if(matrix, bad_sym, msg + " (it is not symmetric).")
        return error_if(matrix, bad_psd, msg + " (it has a negative eigenvalue).")
    if bad_sym:
        worst = np.unravel_index(np.argmax(asym - tol * scale), asym.shape)
        raise ValueError(
            f"{msg}: it differs from its transpose by {float(asym[worst]):.3g}, for "
            f"entries up to {float(scale[worst]):.3g}."
        )
    if bad_psd:
        worst = np.unravel_index(np.argmax(negative), negative.shape)
        raise ValueError(
            f"{msg}: its smallest eigenvalue is {float(vals[worst][0]):.3g}, for a "
            f"largest of {float(top[worst]):.3g}."
        )
    return matrix


def well_conditioned(matrix: Array) -> Bool[Array, ""]:
    r"""Whether a symmetric `matrix` is positive definite and invertible to the
    dtype's precision: its smallest eigenvalue above $10\,n\,\epsilon$ times
    its largest (a rank-deficient matrix's smallest one is rounding, about
    $\epsilon$ times the largest). A decision, so not differentiated (an
    eigenvalue's derivative is fine, but not the eigenvectors' that
    `eigvalsh` carries along, at repeated eigenvalues)."""
    vals, tol = _eigenvalues(matrix)
    return vals[0] > tol * jnp.max(jnp.abs(vals))


def nonsingular(matrix: Array) -> Bool[Array, ""]:
    r"""Whether a symmetric `matrix` (perhaps indefinite) is invertible to the
    dtype's precision: no eigenvalue within $10\,n\,\epsilon$ of 0 relative
    to the largest."""
    vals, tol = _eigenvalues(matrix)
    vals = jnp.abs(vals)
    return jnp.min(vals) > tol * jnp.max(vals)


def _eigenvalues(matrix: Array) -> tuple[Array, float]:
    r"""The eigenvalues of a symmetric `matrix` (NaN if it is not finite), not
    differentiated, and the relative tolerance $10\,n\,\epsilon$."""
    matrix = jax.lax.stop_gradient(matrix)
    n = matrix.shape[0]
    if n == 0:
        return jnp.ones((1,), matrix.dtype), 0.0
    finite = jnp.all(jnp.isfinite(matrix))
    safe = jnp.where(finite, matrix, jnp.eye(n, dtype=matrix.dtype))
    vals = jnp.where(finite, jnp.linalg.eigvalsh(safe), jnp.nan)
    return vals, 10 * n * float(jnp.finfo(matrix.dtype).eps)


class AbstractGaussian(eqx.Module):
    """A Gaussian belief over `dim` coordinates, in some parametrisation.

    Every form converts to the others ([`retrax.relations.MomentGaussian`][]
    by `moment`, [`retrax.relations.CanonicalGaussian`][] by `canonical`) and
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
    - `cov`: $\Sigma$, shape `(n, n)`, symmetric positive semidefinite. A
      non-symmetric `cov`, or one with a negative eigenvalue (beyond
      rounding: $\sqrt{\epsilon}$ relative to the largest), raises a
      `ValueError` naming `cov` (at run time when it is traced). NaN entries
      (from a failed solve) pass.
    """

    mean: Float[Array, " n"]
    cov: Float[Array, "n n"]

    # loose annotations: dtypes and shapes are checked with messages naming them
    def __init__(self, mean: Shaped[ArrayLike, "..."], cov: Shaped[ArrayLike, "..."]):
        mean, cov = as_state("mean", mean), as_state("cov", cov)
        n = mean.shape
        if len(n) != 1 or cov.shape != n * 2:
            raise ValueError(
                "`mean` must have shape (n,) and `cov` shape (n, n), got "
                f"{mean.shape} and {cov.shape}."
            )
        self.mean = mean
        self.cov = _square_checked("cov", cov, psd=True)

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    def moment(self) -> "MomentGaussian":
        return self

    def canonical(self) -> "CanonicalGaussian":
        r"""$\Lambda = \Sigma^{-1}$, $\eta = \Lambda\mu$; NaN for a singular
        $\Sigma$ (such as a clamped coordinate's zero variance, or a
        covariance of lower rank), singular meaning an eigenvalue below
        $10\,n\,\epsilon$ times the largest, where the inverse would be
        rounding error."""
        precision = jnp.linalg.inv(self.cov)
        precision = 0.5 * (precision + precision.T)
        info, precision = nan_unless(
            well_conditioned(self.cov), (precision @ self.mean, precision)
        )
        return CanonicalGaussian(info=info, precision=precision)

    def marginal(self, coords: Sequence[int] | ArrayLike) -> "MomentGaussian":
        idx = as_coords(coords, self.dim)
        return MomentGaussian(mean=self.mean[idx], cov=self.cov[np.ix_(idx, idx)])


class CanonicalGaussian(AbstractGaussian):
    r"""A Gaussian in canonical (information) form, $\propto
    \exp(\eta^\top z - \tfrac12 z^\top\Lambda z)$.

    Products of Gaussians add their canonical parameters
    ([`retrax.relations.combine`][]), quotients subtract them
    ([`retrax.relations.divide`][]); $\Lambda$ may be singular or indefinite
    (a likelihood that says nothing about some direction, or a quotient),
    where the moment form does not exist. Marginalising over coordinates
    $a$ (out of $b$) is the Schur complement:
    $\Lambda_{aa} - \Lambda_{ab}\Lambda_{bb}^{-1}\Lambda_{ba}$,
    $\eta_a - \Lambda_{ab}\Lambda_{bb}^{-1}\eta_b$, NaN when $\Lambda_{bb}$ is
    singular (an eigenvalue within $10\,n\,\epsilon$ of 0, relative to the
    largest).

    **Arguments:**

    - `info`: the information vector $\eta$, shape `(n,)`.
    - `precision`: the precision $\Lambda$, shape `(n, n)`, symmetric (it may
      be singular or indefinite, as a quotient's is). A non-symmetric
      `precision` (beyond rounding: $\sqrt{\epsilon}$ relative to its
      largest entry) raises a `ValueError` naming `precision` (at run time
      when it is traced).
    """

    info: Float[Array, " n"]
    precision: Float[Array, "n n"]

    # loose annotations: dtypes and shapes are checked with messages naming them
    def __init__(
        self, info: Shaped[ArrayLike, "..."], precision: Shaped[ArrayLike, "..."]
    ):
        info, precision = as_state("info", info), as_state("precision", precision)
        n = info.shape
        if len(n) != 1 or precision.shape != n * 2:
            raise ValueError(
                "`info` must have shape (n,) and `precision` shape (n, n), got "
                f"{info.shape} and {precision.shape}."
            )
        self.info = info
        self.precision = _square_checked("precision", precision, psd=False)

    @property
    def dim(self) -> int:
        return self.info.shape[0]

    def moment(self) -> MomentGaussian:
        r"""$\Sigma = \Lambda^{-1}$, $\mu = \Sigma\eta$; NaN unless $\Lambda$ is
        positive definite (a singular or indefinite precision has no moment
        form), singular meaning an eigenvalue below $10\,n\,\epsilon$ times
        the largest."""
        cov = jnp.linalg.inv(self.precision)
        cov = 0.5 * (cov + cov.T)
        mean, cov = nan_unless(well_conditioned(self.precision), (cov @ self.info, cov))
        return MomentGaussian(mean=mean, cov=cov)

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
        # one LU of the eliminated block for every right-hand side; a failed
        # factorisation is lineax's result, folded into the NaN test
        rhs = jnp.concatenate([p_ab.T, self.info[rest][:, None]], axis=1)
        operator = lx.MatrixLinearOperator(p_bb)

        def solve(b):
            sol = lx.linear_solve(operator, b, lx.LU(), throw=False)
            return sol.value, sol.result == lx.RESULTS.successful

        solved, solved_ok = jax.vmap(solve, in_axes=1, out_axes=(1, 0))(rhs)
        factorised = jnp.all(solved_ok)
        precision = p_aa - p_ab @ solved[:, :-1]
        precision = 0.5 * (precision + precision.T)
        info, precision = nan_unless(
            nonsingular(p_bb) & factorised, (h_a - p_ab @ solved[:, -1], precision)
        )
        return CanonicalGaussian(info=info, precision=precision)


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

    Their product, a [`retrax.relations.CanonicalGaussian`][].
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

    The quotient, a [`retrax.relations.CanonicalGaussian`][] (its precision
    need not be positive definite).
    """
    _same_dim([belief, by])
    a, b = belief.canonical(), by.canonical()
    return CanonicalGaussian(info=a.info - b.info, precision=a.precision - b.precision)
