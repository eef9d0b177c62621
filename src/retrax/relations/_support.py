"""The stored training rows of a relation's off-data test, and the test."""

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float


class DataSupport(eqx.Module):
    r"""The training rows a relation's off-data test measures queries against.

    Built by [`retrax.relations.calibrate_off_data`][]; see there for the
    test.

    **Attributes:**

    - `points`: the stored rows, standardised (divided by `scale`), shape
      `(m, n)`.
    - `scale`: the data's standard deviation per coordinate (1 where it is
      0), shape `(n,)`.
    - `clamp`: the calibrated clamp coordinates, a boolean mask of shape
      `(n,)`.
    - `tol`: the calibrated distance $\tau$, in standardised units.
    - `quantile`: the quantile of the rows' own distances that `tol` is.
    """

    points: Float[Array, "m n"]
    scale: Float[Array, " n"]
    clamp: Bool[Array, " n"]
    tol: Float[Array, ""]
    quantile: float

    def ratio(
        self, z: Float[Array, " n"], clamped: Bool[Array, " n"]
    ) -> Float[Array, ""]:
        r"""$D(z)/\tau$ for a query with hard clamps `clamped` at values `z`.

        Above 1 the clamped values are off the data; 0 without clamps. NaN
        when a clamp is not among the calibrated coordinates.
        """
        dtype = z.dtype
        points = self.points.astype(dtype)
        diff = jnp.where(clamped, z / self.scale.astype(dtype) - points, 0)
        dist = jnp.sqrt(jnp.min(jnp.sum(diff * diff, axis=1)))
        covered = ~jnp.any(clamped & ~self.clamp)
        nan = jnp.asarray(jnp.nan, dtype)
        return jnp.where(covered, dist / self.tol.astype(dtype), nan)
