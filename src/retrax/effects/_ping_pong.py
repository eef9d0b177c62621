"""A stereo delay whose echoes alternate between the left and right channels."""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._signal import output, state_leaf, stereo
from ._feedback_delay import AbstractFeedbackDelay, comb_history


class PingPongDelay(AbstractFeedbackDelay):
    r"""A ping-pong delay: two delay lines of $D$ samples that feed each other.

    The mono sum $u = (x_L + x_R)/2$ enters the left line; each line's output
    feeds the other line with gain $g$:
    $s_L[t] = u_t + g\, s_R[t - D]$, $s_R[t] = g\, s_L[t - D]$. So
    $s_L = w$ with $w_t = u_t + g^2 w_{t - 2D}$, a feedback comb of $2D$
    samples ([`retrax.ops.comb`][], whose gradient runs the comb backwards
    in time), and the wet outputs are $s_L[t - D] = w_{t-D}$ (echoes at
    $D, 3D, 5D, \dots$) on the left and $s_R[t - D] = g\, w_{t-2D}$ (at
    $2D, 4D, \dots$) on the right:
    $y_c = (1 - \mathrm{mix})\, x_c + \mathrm{mix}\cdot\mathrm{wet}_c$.

    **Arguments:**

    - `feedback`: the gain $g$ of each crossing, in $[0, 0.95]$ (normalised
      linearly).
    - `mix`: the wet fraction, in $[0, 1]$.
    - `delay_samples`: $D$, a Python `int >= 1` (static, see
      [`FeedbackDelay`][retrax.effects.FeedbackDelay]).

    Takes mono `(time,)` (sent to both channels) or stereo `(2, time)` and
    returns `(2, time)`. The state `zi` holds the last $2D$ values of $w$,
    newest first, shape `(2D,)`. Parameters out of range raise an error
    (also under `jax.jit`).
    """

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: Shaped[ArrayLike, " history"] | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "2 time"] | tuple[Float[Array, "2 time"], Array]:
        """Echo `x` `(time,)` or `(2, time)` from side to side; returns `(2, time)`."""
        x = stereo(x)
        g = self.param("feedback", x.dtype)
        mix = self.param("mix", x.dtype)
        D = self.delay_samples
        zi = state_leaf("zi", zi, (2 * D,), x.dtype)
        u = 0.5 * (x[0] + x[1])
        full, zf = comb_history(u, 2 * D, g * g, zi)
        length = u.shape[0]
        left = full[D : D + length]  # w[t - D]
        right = full[:length]  # w[t - 2D]
        wet = jnp.stack([left, g * right])
        return output((1 - mix) * x + mix * wet, zf, return_zf)
