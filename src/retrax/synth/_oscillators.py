"""Oscillators: a drift-free phase accumulator, a sine and an FM operator."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Real

from .._misc import as_inexact, result_dtype
from .._validate import check_in_range, check_rate


def _real(name: str, value) -> Array:
    arr = as_inexact(name, value)
    if jnp.issubdtype(arr.dtype, jnp.complexfloating):
        raise TypeError(f"`{name}` must be real, got dtype {arr.dtype}.")
    return arr


def _two_sum(a, b):
    """`s + e == a + b` exactly (Knuth), with `s` the rounded sum."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def _split(a):
    """Veltkamp's split of `a` into two halves with no more than half its bits."""
    bits = np.finfo(a.dtype).nmant + 1
    factor = jnp.asarray(2.0 ** ((bits + 1) // 2) + 1.0, a.dtype)
    t = factor * a
    hi = t - (t - a)
    return hi, a - hi


def _two_product(a, b):
    """`p + e == a * b` exactly (Dekker), without relying on a fused multiply-add."""
    p = a * b
    a_hi, a_lo = _split(a)
    b_hi, b_lo = _split(b)
    e = ((a_hi * b_hi - p) + a_hi * b_lo + a_lo * b_hi) + a_lo * b_lo
    return p, e


def _increments(freq, sample_rate):
    """`freq / sample_rate` as an unevaluated sum `hi + lo`, `lo` the rounding error.

    The rounding error of the division is a bias that repeats every sample: in
    float32 it alone would shift the phase of a 440 Hz tone by up to about
    0.005 cycles over three minutes. Carrying it removes that drift.
    """
    hi = freq / sample_rate
    p, e = _two_product(hi, sample_rate)
    lo = ((freq - p) - e) / sample_rate
    return hi, lax.stop_gradient(lo)


def _exclusive_cumsum(x):
    return jnp.concatenate([jnp.zeros((1,), x.dtype), jnp.cumsum(x[:-1])])


@jax.custom_jvp
def _accumulate(inc_hi, inc_lo, phase0):
    """Wrapped phases before each increment, and the phase after the last one.

    The running phase is a double-word `p + c` with `p` in about [0, 1): each
    step adds the increment with an error-free sum, subtracts the integer part
    (exact for the non-negative part; the error of the rest goes into `c`) and
    renormalises, so the error stays at the rounding of one sample, however
    long the signal.
    """
    p0 = phase0 - jnp.floor(phase0)

    def step(carry, inc):
        p, c = carry
        hi, lo = inc
        s, e = _two_sum(p, hi)
        c = c + (e + lo)
        s, e = _two_sum(s, -jnp.floor(s))
        p, c = _two_sum(s, c + e)
        return (p, c), p

    zero = jnp.zeros((), inc_hi.dtype)
    (p, c), ps = lax.scan(step, (p0, zero), (inc_hi, inc_lo))
    phases = jnp.concatenate([p0[None], ps[:-1]])
    # `ps` are rounded double-words: wrap once more and map 1.0 back to 0.
    phases = phases - jnp.floor(phases)
    final = (p + c) - jnp.floor(p + c)
    one = jnp.ones((), phases.dtype)
    return jnp.where(phases >= one, zero, phases), jnp.where(final >= one, zero, final)


@_accumulate.defjvp
def _accumulate_jvp(primals, tangents):
    # The wrap is piecewise constant: the phase's derivative is the running
    # sum of the increments' derivatives, unwrapped.
    d_hi, d_lo, d_phase0 = tangents
    out = _accumulate(*primals)
    d_inc = d_hi + d_lo
    return out, (d_phase0 + _exclusive_cumsum(d_inc), d_phase0 + jnp.sum(d_inc))


def phase(
    freq: Real[ArrayLike, " time"],
    sample_rate: float | Real[ArrayLike, ""],
    phase0: float | Real[ArrayLike, ""] = 0.0,
    *,
    return_zf: bool = False,
) -> Float[Array, " time"] | tuple[Float[Array, " time"], Float[Array, ""]]:
    r"""Phase accumulator: the running phase of an oscillator, in cycles.

    $$\phi_t = \Big(\phi_0 + \sum_{s < t} f_s / f_{\mathrm{s}}\Big) \bmod 1,$$

    so that $\phi_0$ is the phase of the first sample. A plain running sum in
    float32 loses the fraction as the sum grows (after a minute at 440 Hz the
    sum is 26,400 cycles and float32 resolves only about 0.002 of a cycle
    there), and even a wrapped one drifts with the rounding of $f_s / f_{\mathrm s}$,
    repeated every sample. This accumulator wraps every sample and carries
    both rounding errors in a second word (error-free sums, Knuth; an
    error-free product, Dekker), so the float32 phase stays within a few
    float32 roundings of the exact phase over minutes of audio.

    Derivatives: the wrap has zero derivative, so
    $\partial \phi_t / \partial f_s = 1 / f_{\mathrm s}$ for $s < t$; the
    tangent is a running sum (`jnp.cumsum`) and reverse mode its transpose.
    Gradients with respect to `freq`, `sample_rate` and `phase0` are all
    defined. Non-finite `freq` or `phase0`, and a `sample_rate` that is not
    positive and finite, raise an error naming the argument (also under
    `jax.jit`).

    **Arguments:**

    - `freq`: the instantaneous frequency in Hz, one value per sample, shape
      `(T,)`. Negative frequencies run the phase backwards.
    - `sample_rate`: samples per second, a positive scalar.
    - `phase0`: the phase of the first sample, in cycles (wrapped into
      $[0, 1)$).
    - `return_zf`: also return the phase of the sample after the last one,
      to pass as `phase0` of the next block when streaming.

    **Returns:**

    The phases in $[0, 1)$, shape `(T,)`, in the dtype of the inputs (float32
    or float64); with `return_zf`, also the next block's `phase0`.
    """
    freq = _real("freq", freq)
    if freq.ndim != 1:
        raise ValueError(
            f"`freq` must have shape (time,), one value per sample, got shape "
            f"{freq.shape}. For a constant frequency use `jnp.full(T, f)`; batch "
            "several oscillators with `jax.vmap`."
        )
    if isinstance(sample_rate, int | float):
        sample_rate = check_rate("sample_rate", sample_rate)
    sample_rate = _real("sample_rate", sample_rate)
    phase0 = _real("phase0", phase0)
    for name, value in (("sample_rate", sample_rate), ("phase0", phase0)):
        if value.ndim != 0:
            raise ValueError(f"`{name}` must be a scalar, got shape {value.shape}.")
    freq = check_in_range("freq", freq)
    sample_rate = check_in_range("sample_rate", sample_rate, 0.0)
    phase0 = check_in_range("phase0", phase0)
    dtype = result_dtype(freq, sample_rate, phase0)
    freq, sample_rate, phase0 = (v.astype(dtype) for v in (freq, sample_rate, phase0))
    if freq.shape[0] == 0:
        wrapped = phase0 - jnp.floor(phase0)
        return (freq, wrapped) if return_zf else freq
    inc_hi, inc_lo = _increments(freq, sample_rate)
    phases, final = _accumulate(inc_hi, inc_lo, phase0)
    return (phases, final) if return_zf else phases


def sine(
    freq: Real[ArrayLike, " time"],
    sample_rate: float | Real[ArrayLike, ""],
    phase0: float | Real[ArrayLike, ""] = 0.0,
) -> Float[Array, " time"]:
    r"""Sine oscillator $\sin(2\pi \phi_t)$ on the drift-free phase accumulator.

    **Arguments:**

    - `freq`: the instantaneous frequency in Hz, shape `(T,)`.
    - `sample_rate`: samples per second, a positive scalar.
    - `phase0`: the phase of the first sample, in cycles.

    **Returns:**

    The sine wave, shape `(T,)`, in the dtype of the inputs.
    """
    return jnp.sin(2 * jnp.pi * phase(freq, sample_rate, phase0))


def fm_operator(
    freq: Real[ArrayLike, " time"],
    sample_rate: float | Real[ArrayLike, ""],
    modulation: Real[ArrayLike, " time"] | None = None,
    level: float | Real[ArrayLike, ""] | Real[ArrayLike, " time"] = 1.0,
    phase0: float | Real[ArrayLike, ""] = 0.0,
) -> Float[Array, " time"]:
    r"""One FM operator: a sine whose phase is offset by a modulating signal.

    $$y_t = \ell_t \sin\big(2\pi \phi_t + m_t\big),$$

    with $\phi_t$ the [`phase`][retrax.synth.phase] of `freq`, $m_t$ the
    modulation in radians and $\ell_t$ the output level (a constant or an
    envelope). This is phase modulation, as in Yamaha's DX7 and every "FM"
    synthesiser since (Chowning, "The synthesis of complex audio spectra by
    means of frequency modulation", JAES 1973): feeding one operator's output,
    scaled by a modulation index $I$, into another's `modulation` gives the
    spectrum $\sum_n J_n(I) \sin(2\pi (f_c + n f_m) t)$. Operators chain into
    stacks and algorithms by passing outputs along.

    **Arguments:**

    - `freq`: the operator's frequency in Hz (a ratio times the note's
      frequency, for DX7-style patches), shape `(T,)`.
    - `sample_rate`: samples per second, a positive scalar.
    - `modulation`: the phase offset in radians, shape `(T,)`; `None` for an
      unmodulated operator. A signal: its non-finite samples pass through.
    - `level`: the output level: a scalar or an envelope of shape `(T,)`,
      finite (checked, also under `jax.jit`).
    - `phase0`: the phase of the first sample, in cycles.

    **Returns:**

    The operator's output, shape `(T,)`.
    """
    p = phase(freq, sample_rate, phase0)
    arg = 2 * jnp.pi * p
    if modulation is not None:
        modulation = _real("modulation", modulation)
        if modulation.shape != p.shape:
            raise ValueError(
                f"`modulation` must have the shape of `freq` {p.shape}, got "
                f"{modulation.shape}."
            )
        arg = arg + modulation.astype(p.dtype)
    level = _real("level", level)
    if level.ndim > 1 or (level.ndim == 1 and level.shape != p.shape):
        raise ValueError(
            f"`level` must be a scalar or have the shape of `freq` {p.shape}, got "
            f"{level.shape}."
        )
    level = check_in_range("level", level)
    return level.astype(p.dtype) * jnp.sin(arg)
