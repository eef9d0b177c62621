"""Factor-to-channel messages: what a factor's answer says about each channel,
with the channel's incoming anchor divided out."""

from collections.abc import Mapping
from typing import Literal

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from .._errors import filter_jit
from ._abstract_relation import soft_stiffness
from ._belief import laplace_belief
from ._factor import AbstractChannel, Factor
from ._gaussian import CanonicalGaussian, divide
from ._solution import ImplicitSolution


def channel_anchor(
    factor: Factor, marks: Mapping[str, AbstractChannel], name: str, dtype=None
) -> CanonicalGaussian:
    r"""The Gaussian evidence a query puts on one channel.

    $N(\mathrm{value}, \mathrm{precision}^{-1})$ in canonical form for an
    [`retrax.relations.Unobserved`][] channel (its precision, diagonal or a
    matrix), and the
    flat (zero) Gaussian for a [`retrax.relations.Latent`][] one.

    **Arguments:**

    - `factor`: the factor.
    - `marks`: the query's marks.
    - `name`: the channel, which must not be observed.
    - `dtype`: the query's dtype; JAX's default float by default.

    **Returns:**

    A [`retrax.relations.CanonicalGaussian`][] over the channel's block.
    """
    z0, rho, coupling = factor.query_coupled(marks, dtype)
    mark = marks.get(name)
    if mark is not None and mark.clamped:
        raise ValueError(
            f"channel {name!r} is observed (clamped): it has no Gaussian anchor."
        )
    idx = np.asarray(factor.coords(name))
    lam_eff = factor.effective_lambda(z0.dtype)
    diagonal = soft_stiffness(rho[idx]) / lam_eff
    if coupling is None:
        return CanonicalGaussian(info=diagonal * z0[idx], precision=jnp.diag(diagonal))
    precision = jnp.diag(diagonal) + coupling[np.ix_(idx, idx)] / lam_eff
    return CanonicalGaussian(info=precision @ z0[idx], precision=precision)


@filter_jit
def factor_messages(
    factor: Factor,
    sol: ImplicitSolution,
    marks: Mapping[str, AbstractChannel],
    *,
    kind: Literal["gaussian", "point"] = "gaussian",
    dtype=None,
) -> dict[str, CanonicalGaussian | Float[Array, " size"]]:
    r"""The factor's message to each channel, from a query's answer.

    With `kind="gaussian"`, for every channel $c$ that is not observed: the
    Laplace belief of the answer marginalised onto $c$
    ([`retrax.relations.laplace_belief`][] with `coords`), divided by the
    anchor the query put on $c$ ([`retrax.relations.channel_anchor`][]), so
    that the anchor is not counted twice when the message is combined with
    it again: `combine(message, anchor)` is the posterior marginal. This is
    the belief-propagation message from the factor to the variable $c$
    (exact for a Gaussian relation; a Laplace approximation otherwise),
    given the anchors on the other channels. Its precision need not be
    positive definite. With `kind="point"`: every channel's block of the
    answer.

    **Arguments:**

    - `factor`: the factor the query was solved on.
    - `sol`: the query's converged, stable solution
      ([`retrax.relations.factor_infer`][]).
    - `marks`: the query's marks.
    - `kind`: `"gaussian"` (canonical Gaussians) or `"point"` (the answer).
    - `dtype`: the query's dtype; JAX's default float by default.

    **Returns:**

    A dict from channel names to [`retrax.relations.CanonicalGaussian`][]
    messages (non-observed channels) or to the answer's blocks (`"point"`,
    all channels). NaN unless `sol` is converged and stable (Gaussian).
    """
    if not isinstance(factor, Factor):
        raise TypeError(f"`factor` must be a Factor, got {type(factor).__name__}.")
    if kind == "point":
        return factor.split(sol.value)
    if kind != "gaussian":
        raise ValueError(f"`kind` must be 'gaussian' or 'point', got {kind!r}.")
    _, rho, coupling = factor.query_coupled(marks, dtype)
    joint = laplace_belief(factor, sol, rho, coupling=coupling)
    out = {}
    for name, _ in factor.channels:
        mark = marks.get(name)
        if mark is not None and mark.clamped:
            continue
        posterior = joint.marginal(factor.coords(name))
        out[name] = divide(
            posterior.canonical(), channel_anchor(factor, marks, name, dtype)
        )
    return out
