"""Unit conversions of dynamics processors, with torchcomp's formulas."""

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._errors import error_if
from .._misc import as_inexact
from .._validate import check_in_range, check_rate


# 1000 ln 9 ~ 2197: the time in ms for a one-pole step response to rise from
# 10% to 90%; torchcomp (and the analogue-console convention) round it to 2200.
_RISE = 2200.0


def amp2db(
    x: Shaped[ArrayLike, "*shape"], floor: float = 0.0
) -> Float[Array, "*shape"]:
    r"""Amplitude to decibels, $20 \log_{10} \max(x, \mathrm{floor})$.

    With the default `floor=0` this is torchcomp's `amp2db`, and
    `amp2db(0) = -inf` (its gradient there is not finite). Pass a positive
    floor, e.g. `1e-10` (-200 dB), for a finite value and gradient on silence;
    below the floor the gradient is zero.

    **Arguments:**

    - `x`: amplitudes (non-negative; a negative one raises an error, also
      under `jax.jit`; `nan` passes through).
    - `floor`: the smallest amplitude considered, a non-negative Python number.

    **Returns:**

    Decibels, the shape of `x`.
    """
    if not (np.isfinite(floor) and floor >= 0):
        raise ValueError(f"`floor` must be finite and non-negative, got {floor!r}.")
    x = as_inexact("x", x)
    x = error_if(x, jnp.any(x < 0), "`x` must be non-negative amplitudes.")
    return 20.0 * jnp.log10(jnp.maximum(x, floor) if floor > 0 else x)


def db2amp(x: Shaped[ArrayLike, "*shape"]) -> Float[Array, "*shape"]:
    r"""Decibels to amplitude, $10^{x/20}$.

    **Arguments:**

    - `x`: decibels.

    **Returns:**

    Amplitudes, the shape of `x`.
    """
    x = as_inexact("x", x)
    return 10.0 ** (x / 20.0)


def ms2coef(ms: Shaped[ArrayLike, "*shape"], sr: float | int) -> Float[Array, "*shape"]:
    r"""Attack or release time in milliseconds to a one-pole coefficient.

    $c = 1 - \exp(-2200 / (\mathrm{ms} \cdot \mathrm{sr}))$: the one-pole
    smoother $y_n = c x_n + (1 - c) y_{n-1}$ then rises from 10% to 90% of a
    step in about `ms` milliseconds (2200 ~ 1000 ln 9), as in torchcomp.
    `ms = 0` gives $c = 1$, an instantaneous response (no smoothing); its
    derivative there is not finite.

    **Arguments:**

    - `ms`: the time constant in milliseconds, finite and $\ge 0$ (checked at
      run time, also under `jax.jit`).
    - `sr`: the sample rate in Hz, a positive Python number.

    **Returns:**

    The coefficient in $(0, 1]$, the shape of `ms`.
    """
    sr = check_rate("sr", sr)
    ms = check_in_range("ms", as_inexact("ms", ms), 0.0, None, low_open=False)
    return -jnp.expm1(-_RISE / (ms * sr))


def coef2ms(
    coef: Shaped[ArrayLike, "*shape"], sr: float | int
) -> Float[Array, "*shape"]:
    r"""One-pole coefficient to a time in milliseconds, the inverse of `ms2coef`.

    $\mathrm{ms} = -2200 / (\mathrm{sr} \ln(1 - c))$.

    **Arguments:**

    - `coef`: the coefficient in $(0, 1]$ (checked at run time, also under
      `jax.jit`); 1 gives 0 ms.
    - `sr`: the sample rate in Hz, a positive Python number.

    **Returns:**

    The time constant in milliseconds, the shape of `coef`.
    """
    sr = check_rate("sr", sr)
    coef = check_in_range("coef", as_inexact("coef", coef), 0.0, 1.0, high_open=False)
    return -_RISE / (sr * jnp.log1p(-coef))
