r"""Feedback combs and Schroeder allpasses, on the recurrence core.

A feedback comb $y_t = x_t + g_t\, y_{t-D}$ couples only samples that lie a
multiple of $D$ apart. Cut the signal into rows of $D$ samples (row $r$,
column $j$ is sample $t = rD + j$): then column $j$ obeys the first-order
recursion $h_r[j] = g_{rD+j}\, h_{r-1}[j] + x_{rD+j}$, and the comb is the
core's diagonal recursion with $D$ channels over $\lceil T/D \rceil$ steps.
Its derivatives are therefore the core's: the tangent is the same comb
driven by the tangent input, and reverse mode is the comb run backwards in
time, one scan each way.
"""

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike, Float, Shaped

from .._misc import as_inexact, result_dtype
from .._validate import check_delay, check_signal, check_value, check_zi, real_array
from ._fir import fir_state
from ._recurrence import DEFAULT_UNROLL, Method, check_method, recurrence


def check_gain(g: Array, length: int) -> None:
    """A feedback gain: a scalar or one value per sample of `x`."""
    if g.ndim > 1 or (g.ndim == 1 and g.shape[0] != length):
        raise ValueError(
            f"`g` must be a scalar or have one value per sample of `x` ({length},), "
            f"got shape {g.shape}."
        )


def stable_gain(g: ArrayLike) -> ArrayLike:
    """`g` with the check that every `|g| < 1`: a Python or NumPy value raises
    at once, a JAX array (also traced) at run time. Use the returned value."""
    return check_value(
        g,
        lambda xp, v: ~xp.isfinite(v) | (xp.abs(v) >= 1),
        "`g` must be finite with |g| < 1 everywhere: the feedback would "
        "otherwise make the recursion unstable.",
    )


def comb_apply(x: Array, delay: int, g: Array, zi: Array, method: Method) -> Array:
    """$y_t = x_t + g_t y_{t-D}$ with `zi[k] = y[-k-1]`; inputs share a dtype."""
    length = x.shape[0]
    if length == 0:
        return x
    rows = -(-length // delay)
    pad = rows * delay - length
    u = jnp.pad(x, (0, pad)).reshape(rows, delay)
    if g.ndim == 0:
        coeffs = jnp.broadcast_to(g, (delay,))
    else:
        coeffs = jnp.pad(g, (0, pad)).reshape(rows, delay)
    # Column j of the row before the first is y[j - D] = zi[D - 1 - j].
    h = recurrence("diagonal", DEFAULT_UNROLL, coeffs, u, zi[::-1], method)
    return h.reshape(-1)[:length]


def _prepare(x, delay, g, zi_shape, zi, meaning):
    delay = check_delay("delay", delay)
    x = real_array("x", x)
    check_signal("x", x)
    check_gain(real_array("g", g), x.shape[0])
    g = as_inexact("g", stable_gain(g))
    if zi is not None:
        zi = real_array("zi", zi)
    zi = check_zi(zi, zi_shape(delay), meaning(delay))
    dtype = result_dtype(x, g, zi)
    x = x.astype(dtype)
    g = g.astype(dtype)
    zi = jnp.zeros(zi_shape(delay), dtype) if zi is None else zi.astype(dtype)
    return x, delay, g, zi


def comb(
    x: Shaped[ArrayLike, " time"],
    delay: int,
    g: Shaped[ArrayLike, ""] | Shaped[ArrayLike, " time"] | float,
    *,
    zi: Shaped[ArrayLike, " delay"] | None = None,
    return_zf: bool = False,
    method: Method = "sequential",
) -> Float[Array, " time"] | tuple[Float[Array, " time"], Float[Array, " delay"]]:
    r"""Feedback comb filter.

    $$y_t = x_t + g_t\, y_{t-D},$$

    with $H(z) = 1 / (1 - g z^{-D})$ for a constant gain: $D$ resonances
    evenly spaced around the unit circle (peaks for $g > 0$), whose impulse
    response decays by $g$ every $D$ samples. With constant `g` it is
    `scipy.signal.lfilter([1], [1, 0, ..., 0, -g], x)` (`-g` at index `D`);
    a per-sample `g` multiplies the output read back at that sample.

    It runs on retrax's recurrence core as a diagonal recursion with $D$
    channels over blocks of $D$ samples (the samples $D$ apart form one
    first-order recursion), so its derivatives are the core's: the tangent is
    the same comb, and reverse mode runs the comb backwards in time, never
    back-propagating through a per-sample loop. Forward mode, reverse mode and
    higher orders work for `x`, `g` and `zi`.

    **Arguments:**

    - `x`: the input signal, real, time first, shape `(T,)`. Batch with
      `jax.vmap`.
    - `delay`: the loop delay $D$ in samples, a Python `int >= 1` (it fixes
      shapes, so it is static under `jit`).
    - `g`: the feedback gain, a scalar or one value per sample `(T,)`, with
      $|g_t| < 1$.
    - `zi`: the outputs before the first sample, which the definition reads
      for $t < D$, newest first: `zi[k] = y[-k-1]`, shape `(D,)`. Defaults to
      zeros.
    - `return_zf`: also return the last `D` outputs in the same layout, the
      `zi` of the next block, so that a long signal can be filtered block by
      block with the same result as in one call.
    - `method`: how the core runs the recursion, `"sequential"` (default) or
      `"associative"`; see [`allpole`][retrax.ops.allpole].

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` with `zf[k] = y[T-1-k]` (the entries of
    `zi` where `T < D`) if `return_zf`. The dtype is the promoted dtype of the
    inputs (float32 or float64).

    A `delay` that is not an `int >= 1`, or a wrong `zi` shape, raise a
    `ValueError` at once. A `g` that is not finite or has $|g_t| \ge 1$
    raises an error: a Python or NumPy `g` at once (`ValueError`), a JAX
    array at run time (also under `jax.jit`). Non-finite samples of `x` pass
    through.
    """
    check_method(method)
    x, delay, g, zi = _prepare(
        x,
        delay,
        g,
        lambda d: (d,),
        zi,
        lambda d: f"the last {d} outputs y[-1], ..., y[-{d}] (newest first)",
    )
    y = comb_apply(x, delay, g, zi, method)
    if not return_zf:
        return y
    return y, fir_state(y, zi, delay)


def schroeder_allpass(
    x: Shaped[ArrayLike, " time"],
    delay: int,
    g: Shaped[ArrayLike, ""] | Shaped[ArrayLike, " time"] | float,
    *,
    zi: Shaped[ArrayLike, "2 delay"] | None = None,
    return_zf: bool = False,
    method: Method = "sequential",
) -> Float[Array, " time"] | tuple[Float[Array, " time"], Float[Array, "2 delay"]]:
    r"""Schroeder allpass filter.

    $$y_t = -g_t\, x_t + x_{t-D} + g_t\, y_{t-D},$$

    with $H(z) = (-g + z^{-D}) / (1 - g z^{-D})$ for a constant gain: unit
    magnitude at every frequency (Schroeder and Logan, "'Colorless'
    artificial reverberation", 1961), the diffuser of Schroeder and Freeverb
    reverbs. With constant `g` it is `scipy.signal.lfilter(b, a, x)` with
    `b = [-g, 0, ..., 0, 1]` and `a = [1, 0, ..., 0, -g]` (both of length
    `D + 1`). A per-sample `g` follows the difference equation above (direct
    form I: the input and output delay lines are kept apart).

    The feedforward part $-g_t x_t + x_{t-D}$ is a sum of products, and the
    feedback part is [`comb`][retrax.ops.comb] on retrax's recurrence core, so
    derivatives of every order, in both modes, run the comb's adjoint
    recursion.

    **Arguments:**

    - `x`: the input signal, real, time first, shape `(T,)`. Batch with
      `jax.vmap`.
    - `delay`: the delay $D$ in samples, a Python `int >= 1`.
    - `g`: the gain, a scalar or one value per sample `(T,)`, with
      $|g_t| < 1$.
    - `zi`: the history the definition reads before the first sample, shape
      `(2, D)`, newest first: `zi[0, k] = x[-k-1]` (past inputs) and
      `zi[1, k] = y[-k-1]` (past outputs). Defaults to zeros.
    - `return_zf`: also return the last `D` inputs and outputs in the same
      layout, the `zi` of the next block (streaming).
    - `method`: `"sequential"` (default) or `"associative"`, as in `comb`.

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` if `return_zf`, with `zf[0, k] =
    x[T-1-k]` and `zf[1, k] = y[T-1-k]`. The dtype is the promoted dtype of
    the inputs (float32 or float64).

    Errors as for `comb`: `delay` not an `int >= 1` or a wrong `zi` shape
    raise a `ValueError` at once; a non-finite `g` or $|g_t| \ge 1$ raises
    (a Python or NumPy `g` at once, a JAX array at run time, also under
    `jax.jit`).
    """
    check_method(method)
    x, delay, g, zi = _prepare(
        x,
        delay,
        g,
        lambda d: (2, d),
        zi,
        lambda d: (
            f"the last {d} inputs and outputs (newest first), zi[0] = x[-1], ..., "
            f"x[-{d}] and zi[1] = y[-1], ..., y[-{d}]"
        ),
    )
    length = x.shape[0]
    lagged = jnp.concatenate([zi[0, ::-1], x])[:length]  # x[t - D]
    y = comb_apply(lagged - g * x, delay, g, zi[1], method)
    if not return_zf:
        return y
    return y, jnp.stack([fir_state(x, zi[0], delay), fir_state(y, zi[1], delay)])
