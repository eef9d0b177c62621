"""Cascaded second-order sections and frequency responses."""

import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Inexact, Shaped

from .._errors import error_if
from .._misc import as_inexact, result_dtype
from ._lfilter import tdf2_apply
from ._validate import check_finite, check_signal, check_zi


def _check_sos(sos: Array) -> None:
    if sos.ndim != 2 or sos.shape[1] != 6 or sos.shape[0] == 0:
        raise ValueError(
            "`sos` must have shape (n_sections, 6), rows [b0, b1, b2, 1, a1, a2] "
            f"as scipy.signal uses, got shape {sos.shape}."
        )


def _checked_sos(sos: Array) -> Array:
    sos = check_finite("sos", sos)
    return error_if(
        sos,
        jnp.any(sos[:, 3] != 1),
        "`sos` rows must have a0 = sos[:, 3] = 1 (normalise each section by a0).",
    )


def sosfilt(
    sos: Shaped[ArrayLike, "sections 6"],
    x: Shaped[ArrayLike, " time"],
    zi: Shaped[ArrayLike, "sections 2"] | None = None,
    *,
    return_zf: bool = False,
) -> (
    Inexact[Array, " time"]
    | tuple[Inexact[Array, " time"], Inexact[Array, "sections 2"]]
):
    r"""Filter with a cascade of second-order sections, as `scipy.signal.sosfilt`.

    Each row `[b0, b1, b2, a0, a1, a2]` is the biquad
    $(b_0 + b_1 z^{-1} + b_2 z^{-2}) / (a_0 + a_1 z^{-1} + a_2 z^{-2})$, and
    the sections are applied in order. This is the numerically safe way to run
    high-order IIR filters (e.g. `scipy.signal.butter(..., output="sos")`).
    Note that, as in scipy, **the rows include `a0`, which must be 1**, while
    `lfilter` and `allpole` take `a` without the leading 1. Every section runs
    on retrax's recurrence core, so gradients run the adjoint filters
    backwards in time.

    **Arguments:**

    - `sos`: the sections, shape `(n_sections, 6)`, constant.
    - `x`: the input signal, shape `(T,)`. Batch with `jax.vmap`.
    - `zi`: the initial state of every section in scipy's layout (its
      transposed-direct-form-II state), shape `(n_sections, 2)`, e.g. from
      `scipy.signal.sosfilt_zi`. Defaults to zeros.
    - `return_zf`: also return the final state in the same layout, so that a
      long signal can be filtered block by block.

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` if `return_zf`.

    A row whose `a0` is not 1, or non-finite `sos`, raises an error (also
    under `jax.jit`).
    """
    sos = as_inexact("sos", sos)
    x = as_inexact("x", x)
    _check_sos(sos)
    check_signal("x", x)
    n_sections = sos.shape[0]
    zi = check_zi(zi, (n_sections, 2), "two states per section (n_sections, 2)")
    dtype = result_dtype(sos, x, zi)
    sos = _checked_sos(sos.astype(dtype))
    y = x.astype(dtype)
    zf = []
    for s in range(n_sections):
        z = None if zi is None else zi[s].astype(dtype)
        y, z = tdf2_apply(sos[s, :3], sos[s, 4:], y, z)
        zf.append(z)
    if not return_zf:
        return y
    return y, jnp.stack(zf)


def _frequencies(worN, whole: bool, fs: float | int, include_nyquist: bool):
    if isinstance(worN, int):
        if worN < 1:
            raise ValueError(f"`worN` must be a positive integer, got {worN}.")
        last = 2 * jnp.pi if whole else jnp.pi
        endpoint = include_nyquist and not whole
        w = jnp.linspace(0.0, last, worN, endpoint=endpoint)
        return w, w * (fs / (2 * jnp.pi))
    freqs = as_inexact("worN", worN)
    if freqs.ndim != 1:
        raise ValueError(f"`worN` must be an int or a 1-d array, got {freqs.shape}.")
    return freqs * (2 * jnp.pi / fs), freqs


def _poly_at(c: Array, omega: Array) -> Array:
    """$\\sum_k c_k e^{-j \\omega k}$ at every `omega` (complex dtype)."""
    k = jnp.arange(c.shape[0]).astype(omega.dtype)
    phase = omega[:, None] * k
    powers = lax.complex(jnp.cos(phase), -jnp.sin(phase))
    return powers @ c.astype(powers.dtype)


def freqz(
    b: Shaped[ArrayLike, " taps"],
    a: Shaped[ArrayLike, " order"] | None = None,
    worN: int | Shaped[ArrayLike, " freqs"] = 512,
    *,
    whole: bool = False,
    fs: float | int = 2 * jnp.pi,
    include_nyquist: bool = False,
) -> tuple[Inexact[Array, " freqs"], Inexact[Array, " freqs"]]:
    r"""Frequency response $H(e^{j\omega}) = B(e^{j\omega}) / A(e^{j\omega})$.

    As `scipy.signal.freqz(b, [1, *a], worN, whole, fs=fs)`, but **`a`
    excludes the leading 1**, as in `lfilter`. Differentiable in `b` and `a`,
    e.g. to fit a filter to a target magnitude response.

    **Arguments:**

    - `b`: numerator taps, shape `(M+1,)`.
    - `a`: denominator coefficients without the leading 1, shape `(K,)`;
      `None` for an FIR filter.
    - `worN`: the number of frequencies (evenly spaced from 0 up to, not
      including, Nyquist, or the full circle if `whole`), or an array of
      frequencies in the units of `fs`.
    - `whole`: evaluate around the whole unit circle, $[0, 2\pi)$.
    - `fs`: the sample rate the frequencies are expressed in; defaults to
      $2\pi$ (radians per sample).
    - `include_nyquist`: with an integer `worN` and `whole=False`, include
      the Nyquist frequency as the last point.

    **Returns:**

    `(w, h)`: the frequencies (in the units of `fs`) and the complex response.
    """
    b = as_inexact("b", b)
    if b.ndim != 1:
        raise ValueError(f"`b` must have shape (taps,), got shape {b.shape}.")
    if a is not None:
        a = as_inexact("a", a)
        if a.ndim != 1:
            raise ValueError(f"`a` must have shape (order,), got shape {a.shape}.")
    omega, w = _frequencies(worN, whole, fs, include_nyquist)
    real = jnp.finfo(result_dtype(b, a)).dtype
    omega = omega.astype(real)
    h = _poly_at(b, omega)
    if a is not None:
        a_full = jnp.concatenate([jnp.ones(1, a.dtype), a])
        h = h / _poly_at(a_full, omega)
    return w.astype(real), h


def sosfreqz(
    sos: Shaped[ArrayLike, "sections 6"],
    worN: int | Shaped[ArrayLike, " freqs"] = 512,
    *,
    whole: bool = False,
    fs: float | int = 2 * jnp.pi,
    include_nyquist: bool = False,
) -> tuple[Inexact[Array, " freqs"], Inexact[Array, " freqs"]]:
    r"""Frequency response of second-order sections, as `scipy.signal.sosfreqz`.

    The product of every section's $B_s(e^{j\omega}) / A_s(e^{j\omega})$; the
    rows include `a0` as in `sosfilt` (here any non-zero `a0` is divided
    out). Arguments as in `freqz`.

    **Returns:**

    `(w, h)`: the frequencies (in the units of `fs`) and the complex response.
    """
    sos = as_inexact("sos", sos)
    _check_sos(sos)
    omega, w = _frequencies(worN, whole, fs, include_nyquist)
    real = jnp.finfo(sos.dtype).dtype
    omega = omega.astype(real)
    h = None
    for s in range(sos.shape[0]):
        section = _poly_at(sos[s, :3], omega) / _poly_at(sos[s, 3:], omega)
        h = section if h is None else h * section
    return w.astype(real), h
