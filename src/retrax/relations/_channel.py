"""The marks of a factor's channels in a query: observed (a hard clamp),
unobserved (soft, with a precision) or latent (free)."""

import abc

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float

from .._errors import error_if
from .._state import as_state


def _block(name: str, what: str, x, size: int, dtype) -> Float[Array, " size"]:
    x = as_state(f"{name}.{what}", x).astype(dtype)
    if x.shape not in ((), (size,)):
        raise ValueError(
            f"channel {name!r} has size {size}; its `{what}` must be a scalar or "
            f"have shape ({size},), got shape {x.shape}."
        )
    return jnp.broadcast_to(x, (size,))


class AbstractChannel(eqx.Module):
    """How a query treats one channel (a named block) of a factor.

    Each channel answers `query`: the values and stiffnesses of its block in
    the query vectors `z0` and `rho` of
    [`retrax.relations.implicit_infer`][]. Implementations:
    [`retrax.relations.Observed`][] (a hard clamp),
    [`retrax.relations.Unobserved`][] (a soft input with a precision) and
    [`retrax.relations.Latent`][] (free).
    """

    @property
    @abc.abstractmethod
    def clamped(self) -> bool:
        """Whether the channel is held exactly (no belief or message to it)."""

    @abc.abstractmethod
    def query(
        self, name: str, size: int, dtype, lam_eff: Float[Array, ""], check=True
    ) -> tuple[Float[Array, " size"], Float[Array, " size"]]:
        r"""The channel's block of `(z0, rho)`.

        **Arguments:**

        - `name`: the channel's name (for error messages).
        - `size`: the block's size.
        - `dtype`: the query's floating dtype.
        - `lam_eff`: the relation's $\lambda_{\mathrm{eff}}$ (see
          [`retrax.relations.AbstractImplicitRelation.effective_lambda`][]),
          which converts a precision in data units into a stiffness.
        - `check`: whether to check the values (finite, positive precisions),
          raising a message that names the channel. Without the check a bad
          value passes through to the query, whose solve reports it per query
          (`RESULTS.invalid_query`; see [`retrax.relations.implicit_infer`][]
          with `throw=False`).

        **Returns:**

        A tuple `(z0, rho)` of two `(size,)` vectors.
        """

    @abc.abstractmethod
    def coupling(
        self, name: str, size: int, dtype, lam_eff: Float[Array, ""], check=True
    ) -> Float[Array, "size size"] | None:
        r"""The channel's block of the query's coupling matrix: the stiffness
        between its coordinates beyond the diagonal `rho**2` (see
        [`retrax.relations.implicit_infer`][]); `None` for a channel without
        one. Arguments as in `query`."""


class Observed(AbstractChannel):
    """A channel known exactly: a hard clamp (`rho = inf`).

    **Arguments:**

    - `value`: the observed value, a scalar or a vector of the channel's size.
    """

    value: Float[ArrayLike, "..."]

    @property
    def clamped(self) -> bool:
        return True

    def query(self, name, size, dtype, lam_eff, check=True):
        value = _block(name, "value", self.value, size, dtype)
        if check:
            value = error_if(
                value,
                jnp.any(~jnp.isfinite(value)),
                f"the observed value of channel {name!r} must be finite.",
            )
        return value, jnp.full((size,), jnp.inf, dtype)

    def coupling(self, name, size, dtype, lam_eff, check=True):
        return None


class Unobserved(AbstractChannel):
    r"""A channel known up to Gaussian noise: a soft input with a precision.

    The query adds $\tfrac12\,\mathrm{precision}\,(z - \mathrm{value})^2$ to
    the relation's potential (in data units: the stiffness is
    $\rho = \sqrt{\lambda_{\mathrm{eff}}\,\mathrm{precision}}$, so that the
    answer's Laplace belief is the relation's density times the Gaussian
    $N(\mathrm{value}, \mathrm{precision}^{-1})$). A small precision is an
    anchor that selects a branch; an incoming Gaussian message of a factor
    graph enters as one.

    **Arguments:**

    - `value`: the mean of the evidence, a scalar or a vector of the
      channel's size.
    - `precision`: its precision: an inverse variance, positive and finite,
      as a scalar or a vector of the channel's size (independent
      coordinates); or a full precision matrix of shape `(size, size)`,
      symmetric positive semi-definite and finite, such as the `precision`
      of a factor's Gaussian message
      ([`retrax.relations.factor_messages`][]) fed back as evidence. A
      matrix adds $\tfrac12 (z - \mathrm{value})^\top P (z -
      \mathrm{value})$: its diagonal becomes the stiffnesses `rho` and the
      rest the query's coupling matrix (see
      [`retrax.relations.Factor.query_coupled`][]). Symmetry and
      semi-definiteness are checked to $\sqrt{\epsilon}\max|P|$ (the
      dtype's machine epsilon), and the matrix is then symmetrised. A matrix
      whose diagonal is 0 somewhere (a zero row) leaves that coordinate free.
    """

    value: Float[ArrayLike, "..."]
    precision: Float[ArrayLike, "..."]

    @property
    def clamped(self) -> bool:
        return False

    @property
    def full(self) -> bool:
        """Whether the precision is a matrix (else a scalar or a vector)."""
        return jnp.ndim(self.precision) == 2

    def _matrix(self, name, size, dtype, check):
        p = as_state(f"{name}.precision", self.precision).astype(dtype)
        if p.shape != (size, size):
            raise ValueError(
                f"channel {name!r} has size {size}; its precision matrix must "
                f"have shape ({size}, {size}), got shape {p.shape}."
            )
        finite = jnp.all(jnp.isfinite(p))
        safe = jnp.where(finite, p, 0)
        tol = jnp.sqrt(jnp.finfo(dtype).eps) * jnp.max(jnp.abs(safe))
        symmetric = jnp.all(jnp.abs(safe - safe.T) <= tol)
        sym = 0.5 * (safe + safe.T)
        semidefinite = jnp.linalg.eigvalsh(sym)[0] >= -tol
        valid = finite & symmetric & semidefinite
        if check:
            sym = error_if(
                sym,
                ~valid,
                f"the `precision` of the unobserved channel {name!r} must be "
                "finite, symmetric and positive semi-definite (checked to "
                "sqrt(eps) * max|precision|). A factor message's precision "
                "need not be semi-definite: combine it with a prior first.",
            )
        return sym, valid

    def coupling(self, name, size, dtype, lam_eff, check=True):
        if not self.full:
            return None
        sym, valid = self._matrix(name, size, dtype, check)
        off = sym - jnp.diag(jnp.diag(sym))
        return jnp.where(valid, lam_eff.astype(dtype) * off, 0)

    def query(self, name, size, dtype, lam_eff, check=True):
        value = _block(name, "value", self.value, size, dtype)
        if self.full:
            if check:
                value = error_if(
                    value,
                    jnp.any(~jnp.isfinite(value)),
                    f"the value of the unobserved channel {name!r} must be finite.",
                )
            sym, valid = self._matrix(name, size, dtype, check)
            rho = jnp.sqrt(lam_eff.astype(dtype) * jnp.maximum(jnp.diag(sym), 0))
            return value, jnp.where(valid, rho, jnp.asarray(jnp.nan, dtype))
        precision = _block(name, "precision", self.precision, size, dtype)
        if check:
            value = error_if(
                value,
                jnp.any(~jnp.isfinite(value)),
                f"the value of the unobserved channel {name!r} must be finite.",
            )
            precision = error_if(
                precision,
                jnp.any(~(precision > 0) | ~jnp.isfinite(precision)),
                f"the precision of the unobserved channel {name!r} must be "
                "positive and finite (use Observed for a hard clamp, Latent for "
                "none).",
            )
        # A precision that is not positive and finite (unchecked) gives a NaN
        # stiffness, which the query reports, rather than a free or a clamped
        # coordinate.
        valid = (precision > 0) & jnp.isfinite(precision)
        safe = jnp.where(valid, precision, jnp.ones((), dtype))
        rho = jnp.sqrt(lam_eff.astype(dtype) * safe)
        return value, jnp.where(valid, rho, jnp.asarray(jnp.nan, dtype))


class Latent(AbstractChannel):
    """A free channel (`rho = 0`): the relation alone decides it.

    **Arguments:**

    - `start`: where the solve starts on this channel (a scalar or a vector of
      the channel's size); 0 by default.
    """

    start: Float[ArrayLike, "..."] = 0.0

    @property
    def clamped(self) -> bool:
        return False

    def query(self, name, size, dtype, lam_eff, check=True):
        start = _block(name, "start", self.start, size, dtype)
        if check:
            start = error_if(
                start,
                jnp.any(~jnp.isfinite(start)),
                f"the start of the latent channel {name!r} must be finite.",
            )
        return start, jnp.zeros((size,), dtype)

    def coupling(self, name, size, dtype, lam_eff, check=True):
        return None
