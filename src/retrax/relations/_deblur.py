r"""The Laplace precision of a relation with its field nodes' smoothing removed.

At noise level $r_k = \sigma_k/\alpha_k$ an implicit field reads the data
smoothed by $r_k$: for data that are locally Gaussian with covariance
$\Sigma$, the precision $\mathrm{sym}(J)/\lambda_{\mathrm{eff}}$ of
[`retrax.relations.implicit_laplace`][] is
$\sum_k c_k(\Sigma + r_k^2 I)^{-1}$, with the nodes' weights
$c_k = w_k r_k^2/\sum_j w_j r_j^2$. Every term shares $\Sigma$'s
eigenvectors, so along an eigenvector of the measured precision with
eigenvalue $p > 0$ the data's own variance $v$ solves

$$\sum_k \frac{c_k}{v + r_k^2} = p,$$

one root, between $1/p - \sum_k c_k r_k^2$ (Jensen) and $1/p$; for nodes at
one level, $v = 1/p - r^2$. The precision with $1/v$ in place of $p$ is the
data's, exactly for Gaussian data.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, Float


# Halvings of the bracket of each root: from a bracket of width at most
# sum_k c_k r_k^2 to below float64's resolution of 1/p.
_BISECTIONS = 64


def _level_sum(v: Array, r2: Array, c: Array) -> Array:
    return jnp.sum(c / (v[:, None] + r2), axis=-1)


def _deblurred_levels(
    evals: Array, r2: Array, c: Array, max_sharpening: float
) -> Array:
    """Each eigenvalue of the precision mapped to the data's: `1 / v` for
    `p > 0` (see `deblurred_precision`), `p` itself otherwise. The root is
    found by bisection and differentiated by the implicit function theorem
    (one Newton step whose start carries no derivative)."""
    positive = evals > 0
    p = jnp.where(positive, evals, jnp.ones((), evals.dtype))
    floor = 1 / (max_sharpening * p)
    lo = jnp.maximum(1 / p - jnp.sum(c * r2), floor)
    hi = 1 / p

    def halve(_, bracket):
        lo, hi = bracket
        mid = 0.5 * (lo + hi)
        above = _level_sum(mid, r2, c) > p  # the root lies above `mid`
        return jnp.where(above, mid, lo), jnp.where(above, hi, mid)

    lo, hi = lax.fori_loop(
        0, _BISECTIONS, halve, (lax.stop_gradient(lo), lax.stop_gradient(hi))
    )
    root = lax.stop_gradient(0.5 * (lo + hi))
    slope = -jnp.sum(c / (root[:, None] + r2) ** 2, axis=-1)
    root = root - (_level_sum(root, r2, c) - p) / slope
    capped = lax.stop_gradient(root) <= lax.stop_gradient(floor)
    variance = jnp.where(capped, floor, root)
    return jnp.where(positive, 1 / variance, evals)


@functools.partial(jax.custom_jvp, nondiff_argnums=(3,))
def _spectral(sym: Array, r2: Array, c: Array, max_sharpening: float) -> Array:
    evals, evecs = jnp.linalg.eigh(sym)
    return (evecs * _deblurred_levels(evals, r2, c, max_sharpening)) @ evecs.T


@_spectral.defjvp
def _spectral_jvp(max_sharpening, primals, tangents):
    # The derivative of a spectral function V g(L) V^T (Daleckii and Krein):
    # V (G o (V^T dS V)) V^T with G_ij the divided difference of g at the
    # eigenvalues i and j, and g' where they coincide, so that it is finite
    # at repeated eigenvalues (an isotropic relation), where the derivative
    # of the eigenvectors is not; plus g's own dependence on the levels.
    sym, r2, c = primals
    dsym, dr2, dc = tangents
    evals, evecs = jnp.linalg.eigh(sym)

    new, linear = jax.linearize(
        lambda e, r2, c: _deblurred_levels(e, r2, c, max_sharpening), evals, r2, c
    )
    # one bisection serves both: the map acts on each eigenvalue alone, so
    # its derivative in them is the diagonal a tangent of ones reads off
    slope = linear(jnp.ones_like(evals), jnp.zeros_like(r2), jnp.zeros_like(c))
    dlevels = linear(jnp.zeros_like(evals), dr2, dc)
    gap = evals[:, None] - evals[None, :]
    scale = jnp.max(jnp.abs(evals)) + jnp.finfo(evals.dtype).tiny
    close = jnp.abs(gap) <= 100 * jnp.finfo(evals.dtype).eps * scale
    divided = (new[:, None] - new[None, :]) / jnp.where(close, 1, gap)
    mean_slope = 0.5 * (slope[:, None] + slope[None, :])
    weights = jnp.where(close, mean_slope, divided)
    inner = evecs.T @ (0.5 * (dsym + dsym.T)) @ evecs
    out = (evecs * new) @ evecs.T
    return out, evecs @ (weights * inner + jnp.diag(dlevels)) @ evecs.T


def deblurred_precision(
    precision: Float[Array, "n n"],
    r2: Float[Array, " K"],
    c: Float[Array, " K"],
    max_sharpening: float,
) -> Float[Array, "n n"]:
    r"""`precision` with the smoothing of levels `r2` (weights `c`, summing to
    1) removed along each of its eigenvectors with a positive eigenvalue.

    Directions of zero or negative curvature are kept as measured (no
    Gaussian explains them). Where the measured curvature is at least what
    the levels' noise alone allows ($p \ge \sum_k c_k/r_k^2$: the network is
    sharper than its own noise), the root is not positive; the variance is
    then held at `1 / (max_sharpening * p)`, as it is wherever the root is
    smaller, so that no direction sharpens by more than `max_sharpening`.

    Differentiable in all three arrays, also where eigenvalues repeat.
    """
    return _spectral(0.5 * (precision + precision.T), r2, c, max_sharpening)


def node_levels(schedule, nodes, dtype) -> tuple[Array, Array]:
    """`(r2, c)`: the nodes' noise variances $r_k^2 = \\sigma_k^2/\\alpha_k^2$ and
    their weights $w_k r_k^2 / \\sum_j w_j r_j^2$ in the field's curvature."""
    t = nodes.t  # checked when the nodes were built: no check staged here
    r2 = (schedule._sigma(t) ** 2 / schedule._alpha(t) ** 2).astype(dtype)
    weight = nodes.w.astype(dtype) * r2
    return r2, weight / jnp.sum(weight)
