"""Frequency responses, as `scipy.signal.freqz` and `freqz_sos`."""

import math
import operator
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Inexact, Shaped

from .._compiled import compiled
from .._errors import error_if
from .._validate import check_dtype, check_finite
from ._scipy_args import as_array, compute_dtype, host_arrays, scipy_dtype
from ._sosfilt import checked_sos, sos_array


# a number of frequencies (an int or a 0-d integer array), or the frequencies
WorN = int | Shaped[ArrayLike, " freqs"] | Shaped[ArrayLike, ""] | list | tuple | None


def _count(worN) -> int | None:
    """`worN` as a number of frequencies, by scipy's rule (`operator.index` of
    a 0-d value: `7` and `np.array(7)` are counts, `7.0` and `[7]` are
    frequencies), or `None` if it gives the frequencies."""
    if np.ndim(worN) != 0:
        return None
    if isinstance(worN, jax.core.Tracer) and jnp.issubdtype(worN.dtype, jnp.integer):
        raise TypeError(
            "`worN` as a number of frequencies fixes the shape of the result, so "
            "it must be a Python int or a concrete array, not a traced one (close "
            "over it, or mark it static in `jax.jit`)."
        )
    try:
        return operator.index(worN)
    except TypeError:
        return None


def _frequencies(
    n: int | None, freqs, whole: bool, fs: Array, include_nyquist: bool, real
):
    """`(omega, w)`: radians per sample and the frequencies in units of `fs`,
    for `n` evenly spaced frequencies or the frequencies `freqs` (`_worN`)."""
    if n is not None:
        last = 2 * math.pi if whole else math.pi
        endpoint = include_nyquist and not whole
        omega = jnp.linspace(0.0, last, n, endpoint=endpoint, dtype=real)
        return omega, omega * (fs / (2 * math.pi))
    freqs = jnp.atleast_1d(as_array("worN", freqs, real))
    return freqs * (2 * math.pi / fs), freqs


def _single_number(fs) -> None:
    """A `ValueError` unless `fs` is one number (a scalar or a 0-d array)."""
    if isinstance(fs, bool) or not (
        isinstance(fs, int | float | np.integer | np.floating)
        or (hasattr(fs, "shape") and jnp.shape(fs) == ())
    ):
        raise ValueError(f"`fs` must be a single number (a sample rate), got {fs!r}.")


def _fs_message(fs) -> str:
    shown = "" if isinstance(fs, jax.core.Tracer) else f", got {fs!r}"
    return f"`fs` must be a positive, finite number (a sample rate){shown}."


def _checked_fs(fs, real) -> Array:
    """The sample rate `fs` as a 0-d array of `real`: a `ValueError` unless it
    is a single positive finite number (a run-time error if it is traced)."""
    _single_number(fs)
    value = as_array("fs", fs, real)
    # a Python or NumPy `fs` is checked by NumPy, so at once also under `jit`
    xp, checked = (jnp, value) if isinstance(fs, jax.Array) else (np, np.asarray(fs))
    return error_if(value, ~(xp.isfinite(checked) & (checked > 0)), _fs_message(fs))


# Up to this many coefficients Horner's rule is unrolled; beyond, one scan.
_UNROLLED = 32


def _unit(omega: Array) -> Array:
    r"""$z = e^{-j\omega}$: one cosine and one sine per frequency."""
    return lax.complex(jnp.cos(omega), -jnp.sin(omega))


def _poly_at(c: Array, z: Array) -> Array:
    r"""$\sum_k c_k z^k$ by Horner's rule (as scipy's `polyval` path), `c`'s
    first axis the coefficients and $z = e^{-j\omega}$ from `_unit`: one
    complex multiply-add per coefficient and frequency, instead of a cosine
    and a sine of every $k\omega$.

    `c.shape[1:]` broadcasts with `z`'s shape, as in scipy.
    """
    c = c.astype(z.dtype)
    acc = c[-1] + jnp.zeros_like(z)
    if c.shape[0] <= _UNROLLED:
        for k in range(c.shape[0] - 2, -1, -1):
            acc = acc * z + c[k]
        return acc
    acc, _ = lax.scan(lambda acc, ck: (acc * z + ck, None), acc, c[-2::-1])
    return acc


def freqz(
    b: Shaped[ArrayLike, " taps *b_filters"] | list | tuple,
    a: Shaped[ArrayLike, " order *a_filters"] | list | tuple | float | int = 1,
    worN: WorN = 512,
    whole: bool = False,
    plot: Callable | None = None,
    fs: float | int | Shaped[ArrayLike, ""] = 2 * math.pi,
    include_nyquist: bool = False,
) -> tuple[Inexact[Array, " freqs"], Inexact[Array, "..."]]:
    r"""Frequency response $H = B / A$ on the unit circle, as `scipy.signal.freqz`.

    $H(e^{j\omega}) = B(e^{j\omega}) / A(e^{j\omega})$.

    **Convention: scipy's.** `a` includes `a[0]` (default `1`, an FIR
    filter), and the arguments and results are scipy's. Differentiable in
    `b` and `a`, e.g. to fit a filter to a target magnitude response.

    **Arguments:**

    - `b`: the numerator coefficients, shape `(M+1,)`; with more dimensions,
      the coefficients run along the first and the others broadcast with `a`'s
      and the frequencies' shapes, as in scipy.
    - `a`: the denominator coefficients including `a[0]`, shape `(N+1,)`.
    - `worN`: the number of frequencies (evenly spaced from 0 up to, not
      including, Nyquist, or around the whole circle if `whole`), or an array
      of frequencies in the units of `fs`. `None` means 512. As in scipy, a
      0-d integer array (`np.array(7)`) is a number of frequencies; it fixes
      the result's shape, so it cannot be traced.
    - `whole`: evaluate around the whole unit circle, $[0, 2\pi)$.
    - `plot`: a callable called with `(w, h)`, as in scipy.
    - `fs`: the sample rate the frequencies are expressed in; defaults to
      $2\pi$ (radians per sample).
    - `include_nyquist`: with an integer `worN` and `whole=False`, make the
      last frequency Nyquist.

    **Returns:**

    `(w, h)`: the frequencies (in the units of `fs`, real) and the complex
    response, in the precision of the promoted dtype of `b` and `a`; float16
    and bfloat16 coefficients are computed in float32 (complex64, as scipy
    returns for float16).

    A non-finite entry of `b` or `a` and an `fs` that is not a positive
    finite number raise `ValueError` naming the argument; under `jax.jit`
    (traced values) they are run-time errors.
    """
    dtype = compute_dtype(scipy_dtype(b, a))
    real = np.dtype(jnp.finfo(dtype).dtype)
    n, freqs = _worN(worN)
    fs = _host_fs(fs, real)
    b, a = host_arrays(dtype, b=b, a=a)
    (freqs,) = host_arrays(real, worN=freqs)
    w, h = _freqz(
        b, a, freqs, fs, n=n, whole=whole, include_nyquist=include_nyquist, dtype=dtype
    )
    if plot is not None:
        plot(w, h)
    return w, h


def _worN(worN: WorN) -> tuple[int | None, WorN]:
    """`worN` as `(count, None)` or `(None, frequencies)`, checked."""
    if worN is None:
        worN = 512
    n = _count(worN)
    if n is not None:
        if n < 0:
            raise ValueError(f"`worN` must be non-negative, got {n}.")
        return n, None
    if isinstance(worN, complex):
        worN = worN.real
    return None, worN


def _host_fs(fs, real: np.dtype):
    """`fs` checked at once unless it is a JAX array (`_checked_fs` checks that
    one when it runs), as a NumPy number of `real`: on the host, with NumPy,
    so an eager call puts nothing on the device before its program."""
    if isinstance(fs, jax.Array):
        return fs
    if not (type(fs) is float or (type(fs) is int and abs(fs) < 2**63)):
        # (a Python number, the usual `fs`, is one real number already)
        _single_number(fs)
        check_dtype("fs", fs)
        if np.iscomplexobj(fs):
            raise TypeError(f"`fs` is complex but the result dtype is {real}.")
    # checked after the cast: 1e300 is no float32 sample rate
    value = np.asarray(fs).astype(real)
    bad = not (math.isfinite(value) and value > 0)
    return error_if(value, bad, _fs_message(fs))


@compiled(static=("n", "whole", "include_nyquist", "dtype"))
def _freqz(b, a, freqs, fs, *, n, whole, include_nyquist, dtype):
    """`freqz` after its arguments' checks and `host_arrays`, compiled as a whole."""
    b = check_finite("b", jnp.atleast_1d(as_array("b", b, dtype)))
    a = check_finite("a", jnp.atleast_1d(as_array("a", a, dtype)))
    real = jnp.finfo(dtype).dtype
    fs = _checked_fs(fs, real)
    omega, w = _frequencies(n, freqs, whole, fs, include_nyquist, real)
    z = _unit(omega)
    return w, _poly_at(b, z) / _poly_at(a, z)


def freqz_sos(
    sos: Shaped[ArrayLike, "sections 6"] | list | tuple,
    worN: WorN = 512,
    whole: bool = False,
    fs: float | int | Shaped[ArrayLike, ""] = 2 * math.pi,
) -> tuple[Inexact[Array, " freqs"], Inexact[Array, " freqs"]]:
    r"""Frequency response of second-order sections, as `scipy.signal.freqz_sos`.

    **Convention: scipy's.** The rows are `[b0, b1, b2, a0, a1, a2]` with
    `a0 == 1`, as in [`sosfilt`][retrax.ops.sosfilt]; the response is the
    product of every section's. Arguments as in [`freqz`][retrax.ops.freqz].
    `sosfreqz` is the same function under scipy's older name.

    A row whose `a0` is not 1, a non-finite entry of `sos` and an `fs` that is
    not a positive finite number raise `ValueError` naming the argument;
    under `jax.jit` (traced values) they are run-time errors.

    **Returns:**

    `(w, h)`: the frequencies (in the units of `fs`) and the complex response.
    """
    dtype = compute_dtype(scipy_dtype(sos))
    real = np.dtype(jnp.finfo(dtype).dtype)
    n, freqs = _worN(worN)
    fs = _host_fs(fs, real)
    (sos,) = host_arrays(dtype, sos=sos)
    (freqs,) = host_arrays(real, worN=freqs)
    return _freqz_sos(sos, freqs, fs, n=n, whole=whole, dtype=dtype)


@compiled(static=("n", "whole", "dtype"))
def _freqz_sos(sos, freqs, fs, *, n, whole, dtype):
    """`freqz_sos` after its arguments' checks and `host_arrays`, compiled as a
    whole."""
    sos = checked_sos(sos_array(sos, dtype))
    real = jnp.finfo(sos.dtype).dtype
    fs = _checked_fs(fs, real)
    omega, w = _frequencies(n, freqs, whole, fs, False, real)
    z = _unit(omega)
    # every section at once (the program does not grow with their number),
    # multiplied in scipy's order, first to last
    sections = jax.vmap(lambda c: _poly_at(c[:3], z) / _poly_at(c[3:], z))(sos)
    h, _ = lax.scan(lambda h, section: (h * section, None), sections[0], sections[1:])
    return w, h


sosfreqz = freqz_sos
