r"""Feedback delay networks by frequency sampling, and their impulse responses.

The transfer function of `fdn` is sampled on `n_fft // 2 + 1` points of the
unit circle, one batched `N x N` linear solve per point, and an inverse real
FFT gives the impulse response: the method of the differentiable-FDN
literature (Dal Santo et al., "Differentiable feedback delay network for
colorless reverberation", DAFx 2023; the `flamo` library). Sampling $H$ at
$M$ points gives the response aliased with period $M$,
$\sum_k h[n + kM]$, so it equals the time-domain response where that has
decayed within $M$ samples. Its cost does not grow with the delay lengths or
run sequentially over time, which is what makes long responses cheap to
train; it does not stream.
"""

from typing import Literal

import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Complex, Float, Shaped

from .._errors import error_if
from .._misc import as_inexact, result_dtype
from .._validate import check_positive_int, check_value
from ._fdn import check_delays, checked_network, fdn


def _checked_line_gains(line_gains, lines: int, bins: int):
    g = as_inexact("line_gains", line_gains)
    if g.shape not in ((lines,), (bins, lines)):
        raise ValueError(
            f"`line_gains` must have shape ({lines},) (one gain per delay line) or "
            f"({bins}, {lines}) (one row per frequency, n_fft // 2 + 1 rows), got "
            f"shape {g.shape}."
        )
    return check_value(
        line_gains,
        lambda xp, v: ~xp.all(xp.isfinite(v)) | xp.any(xp.abs(v) > 1),
        "`line_gains` must be finite with magnitude at most 1 (a gain above 1 "
        "makes the network grow without bound).",
    )


def fdn_frequency_response(
    delays: tuple[int, ...] | list[int],
    A: Shaped[ArrayLike, "lines lines"],
    b: Shaped[ArrayLike, " lines"],
    c: Shaped[ArrayLike, " lines"],
    d: Shaped[ArrayLike, ""] | float | None = None,
    *,
    n_fft: int,
    line_gains: Shaped[ArrayLike, " lines"]
    | Shaped[ArrayLike, "bins lines"]
    | None = None,
) -> Complex[Array, " bins"]:
    r"""The transfer function of a feedback delay network on the FFT's frequencies.

    The network of `fdn`, optionally with a gain $\Gamma_i$ at the output of
    each delay line (an absorption filter given by its frequency response),

    $$H(z) = c^\top \left(I - G(z) A\right)^{-1} G(z)\, b + d, \qquad
      G(z) = \operatorname{diag}\left(\Gamma_i(z)\, z^{-m_i}\right),$$

    evaluated at $z_k = e^{2\pi j k / M}$, $k = 0, \dots, M/2$ ($M$ =
    `n_fft`): the bins of `jnp.fft.rfft` of a length-$M$ signal. With
    $\Gamma = 1$ this is $c^\top (D(z)^{-1} - A)^{-1} b + d$,
    $D(z) = \operatorname{diag}(z^{-m_i})$, and it equals
    `jnp.fft.rfft(h)` for the impulse response `h` of `fdn` where that has
    decayed within `n_fft` samples (sampling the circle aliases the response
    with period `n_fft`).

    One batched `N x N` complex linear solve per frequency; derivatives
    (both modes, every order) go through the solve, whose LU factors its
    tangents and cotangents reuse.

    **Arguments:**

    - `delays`: the line lengths $m_i$, a sequence of $N$ Python ints `>= 1`.
    - `A`: the feedback matrix, real, shape `(N, N)`, spectral norm at most 1
      (1 is allowed: a lossless network).
    - `b`, `c`: the input and output gains, real, shape `(N,)`.
    - `d`: the direct gain, a real scalar; `None` means 0.
    - `n_fft`: the number $M$ of points on the whole circle, a positive int;
      `n_fft // 2 + 1` frequencies are returned.
    - `line_gains`: $\Gamma$, real or complex with magnitude at most 1, shape
      `(N,)` (constant) or `(n_fft // 2 + 1, N)` (a response per line, e.g.
      a frequency-dependent attenuation); `None` means 1.

    **Returns:**

    $H(z_k)$, complex, shape `(n_fft // 2 + 1,)`: complex64 for float32
    inputs, complex128 for float64.

    Shapes and `delays` are checked at once; non-finite values, an `A` of
    spectral norm above 1 (beyond rounding, `100 eps`) or `line_gains` above
    1 in magnitude raise an error, NumPy values at once and JAX arrays at run
    time (under `jax.jit` too). So does a pole exactly on a sampled frequency
    (a lossless network can have one, e.g. `A = I` at $z = 1$), where the
    response is infinite. `A`, `b`, `c`, `d` of a dtype other than float32
    or float64 (float16, bfloat16) raise `TypeError` naming it.
    """
    delays = check_delays(delays)
    check_positive_int("n_fft", n_fft)
    lines, bins = len(delays), n_fft // 2 + 1
    A, b, c, dd = checked_network(delays, A, b, c, d)
    if line_gains is not None:
        line_gains = as_inexact("line_gains", _checked_line_gains(
            line_gains, lines, bins))  # fmt: skip
    dtype = result_dtype(A, b, c, dd, line_gains)
    cdtype = np.result_type(dtype, np.complex64)
    real = jnp.finfo(cdtype).dtype
    # z_k^{-m_i} from the exact integer phase (k m_i mod M), so long delays and
    # many bins lose no accuracy to a large floating-point angle.
    turns = (np.arange(bins)[:, None] * np.asarray(delays)[None, :]) % n_fft
    angle = jnp.asarray(2 * np.pi * turns / n_fft, real)
    g = lax.complex(jnp.cos(angle), -jnp.sin(angle)).astype(cdtype)
    if line_gains is not None:
        g = g * line_gains.astype(cdtype)
    A, b, c, dd = (v.astype(cdtype) for v in (A, b, c, dd))
    system = jnp.eye(lines, dtype=cdtype) - g[:, :, None] * A[None]
    o = jnp.linalg.solve(system, (g * b)[:, :, None])[:, :, 0]
    h = o @ c + dd
    return error_if(
        h,
        ~jnp.all(jnp.isfinite(h)),
        "The network has a pole on a sampled frequency (its response is "
        "infinite there, e.g. a lossless `A` with an eigenvalue 1 at z = 1): "
        "scale `A` or `line_gains` by a gain below 1, or change `n_fft`.",
    )


def fdn_impulse_response(
    delays: tuple[int, ...] | list[int],
    A: Shaped[ArrayLike, "lines lines"],
    b: Shaped[ArrayLike, " lines"],
    c: Shaped[ArrayLike, " lines"],
    d: Shaped[ArrayLike, ""] | float | None = None,
    *,
    length: int,
    method: Literal["time", "frequency"] = "time",
    n_fft: int | None = None,
    line_gains: Shaped[ArrayLike, " lines"]
    | Shaped[ArrayLike, "bins lines"]
    | None = None,
) -> Float[Array, " length"]:
    r"""The first `length` samples of a feedback delay network's impulse response.

    The response $h$ of `fdn` (with the optional line gains of
    `fdn_frequency_response`), computed one of two ways:

    - `method="time"`: `fdn` run on a unit impulse, on the recurrence core
      (exact; sequential over time, in blocks of the shortest delay).
      `line_gains` must then be constant, shape `(N,)` (real), and are
      folded into the network: `fdn(x, delays, A * line_gains, b,
      c * line_gains, d)`.
    - `method="frequency"`: frequency sampling, `jnp.fft.irfft(
      fdn_frequency_response(..., n_fft=n_fft), n_fft)[:length]`. This is
      the time-domain response aliased with period `n_fft`, so it equals
      `method="time"` where the response has decayed within `n_fft` samples
      (choose `n_fft` so that it has; it defaults to `length`). Its cost is
      a batched solve and an FFT, parallel over frequencies, which makes long
      responses cheap to train.

    **Arguments:**

    - `delays`, `A`, `b`, `c`, `d`, `line_gains`: the network, as in
      `fdn_frequency_response`.
    - `length`: the number of samples returned, a positive int.
    - `method`: `"time"` or `"frequency"`.
    - `n_fft`: the number of frequency samples for `method="frequency"`, an
      int `>= length` (default `length`); not used by `"time"`.

    **Returns:**

    `h` of shape `(length,)`, real, in the inputs' promoted dtype.

    The same checks as `fdn_frequency_response` hold, eagerly and under
    `jax.jit`.
    """
    check_positive_int("length", length)
    if method == "time":
        if n_fft is not None:
            raise ValueError('`n_fft` is only used by method="frequency".')
        delays = check_delays(delays)
        lines = len(delays)
        A, b, c, d = checked_network(delays, A, b, c, d)
        if line_gains is not None:
            gains = as_inexact("line_gains", line_gains)
            if gains.shape != (lines,) or jnp.iscomplexobj(gains):
                raise ValueError(
                    'method="time" takes constant real `line_gains` of shape '
                    f"({lines},), got shape {gains.shape} ({gains.dtype}); use "
                    'method="frequency" for a gain per frequency.'
                )
            gains = as_inexact("line_gains", _checked_line_gains(gains, lines, 0))
            A, c = A * gains, c * gains
        dtype = result_dtype(A, b, c, d)
        x = jnp.zeros(length, dtype).at[0].set(1)
        return fdn(x, delays, A, b, c, d)
    if method != "frequency":
        raise ValueError(f'`method` must be "time" or "frequency", got {method!r}.')
    n_fft = length if n_fft is None else n_fft
    check_positive_int("n_fft", n_fft)
    if n_fft < length:
        raise ValueError(
            f"`n_fft` ({n_fft}) must be at least `length` ({length}): the "
            "frequency samples give one period of n_fft samples."
        )
    response = fdn_frequency_response(
        delays, A, b, c, d, n_fft=n_fft, line_gains=line_gains
    )
    return jnp.fft.irfft(response, n_fft)[:length]
