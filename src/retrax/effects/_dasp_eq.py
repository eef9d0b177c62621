r"""dasp-pytorch's six-band parametric equaliser, by its definition.

dasp-pytorch 0.0.1's `dasp_pytorch.functional.parametric_eq` builds six RBJ
cookbook sections (a low shelf, four peaks, a high shelf; its
`signal.biquad`) and applies their cascade by frequency sampling (its
`sosfilt_via_fsm`): with $N = 2^{\lceil \log_2 (2T - 1)\rceil}$ for a signal
of $T$ samples and $\omega_k = 2\pi k / N$,

$$y = \mathrm{irfft}_N\Big(\mathrm{rfft}_N(x) \prod_{s=1}^{6}
  \frac{B_s(e^{i\omega_k})}{A_s(e^{i\omega_k})}\Big)_{0:T},$$

a circular convolution with the cascade's $N$-periodic impulse response,
not the recursion (whose tail beyond the signal it folds back onto its
start). retrax's [`ParametricEQ`][retrax.filters.ParametricEQ] runs the
recursion; this module computes dasp's frequency sampling.

The one numerical choice: the responses are evaluated from the parameters,
not from the rounded coefficients. With $A = 10^{G/40}$,
$\omega_0 = 2\pi f_0/f_s$, $\alpha = \sin\omega_0 / (2Q)$,
$\beta = \sqrt{A}\,\alpha$, $s = \sin\omega$,
$c = \cos\omega - \cos\omega_0 = 2\sin\frac{\omega_0 + \omega}{2}
\sin\frac{\omega_0 - \omega}{2}$ and
$d = 1 - \cos\omega_0\cos\omega = \sin^2\frac{\omega_0 - \omega}{2} +
\sin^2\frac{\omega_0 + \omega}{2}$, multiplying numerator and denominator
by $e^{i\omega}$ gives

$$H_{\text{peak}} = \frac{c + i\alpha A s}{c + i(\alpha/A) s},\quad
H_{\text{low}} = A\,\frac{(A+1)c + (A-1)d + 2i\beta s}
  {(A+1)c - (A-1)d + 2i\beta s},\quad
H_{\text{high}} = A\,\frac{(A+1)c - (A-1)d + 2i\beta s}
  {(A+1)c + (A-1)d + 2i\beta s},$$

the same ratios without the cancellation of $1 + a_1 + a_2$ near
$\omega = 0$ (about $\omega_0^2$ for a 20 Hz shelf, $10^{-5}$), which costs
dasp's own float32 response up to $10^{-2}$ relative there; in float32 this
form keeps the response to float32 precision.
"""

import math
from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import (
    AbstractRangedEffect,
    Range,
    fields_as_they_are,
    logit_to_unconstrained,
    logit_with_unconstrained,
    with_values_by_tree_at,
)
from .._misc import as_inexact
from .._signal import no_state, output, signal
from .._validate import check_init_range, check_rate
from ._dasp_compressor import _fft_length


SECTIONS = ("low_shelf", "band0", "band1", "band2", "band3", "high_shelf")


def dasp_eq_ranges(sample_rate: float) -> dict[str, tuple[float, float]]:
    """dasp's `modules.ParametricEQ(sample_rate).param_ranges`, in its order:
    for each section (low shelf, four bands, high shelf) its gain in dB,
    cutoff frequency in Hz and Q."""
    top = (sample_rate // 2) - 1000
    cutoffs = {
        "low_shelf": (20.0, 2000.0),
        "band0": (80.0, 2000.0),
        "band1": (2000.0, 8000.0),
        "band2": (8000.0, 12000.0),
        "band3": (12000.0, top),
        "high_shelf": (4000.0, top),
    }
    ranges = {}
    for section in SECTIONS:
        ranges[f"{section}_gain_db"] = (-20.0, 20.0)
        ranges[f"{section}_cutoff_freq"] = cutoffs[section]
        ranges[f"{section}_q_factor"] = (0.1, 6.0)
    return ranges


def _check_rate(sample_rate: float | int) -> float:
    """A sample rate at which dasp's ranges are ranges: its top band starts
    at 12 kHz and ends 1 kHz below Nyquist."""
    rate = check_rate("sample_rate", sample_rate)
    if not (rate // 2) - 1000 > 12_000:
        raise ValueError(
            "`sample_rate` must exceed 26 kHz for dasp-pytorch's equaliser (its "
            f"band3 spans 12 kHz to 1 kHz below Nyquist), got {sample_rate!r}."
        )
    return rate


def _response(freqs, gains_db, qs, sample_rate: float, n: int, dtype) -> Array:
    """The cascade's response at the `n // 2 + 1` frequencies $2\\pi k / n$
    (see the module)."""
    k = np.arange(n // 2 + 1)
    w = jnp.asarray(2 * np.pi * k / n, dtype)[None]
    s = jnp.asarray(np.sin(2 * np.pi * k / n), dtype)[None]
    w0 = (2 * math.pi / sample_rate) * freqs[:, None]
    A = 10.0 ** (gains_db[:, None] / 40.0)
    alpha = jnp.sin(w0) / (2.0 * qs[:, None])
    plus, minus = jnp.sin(0.5 * (w0 + w)), jnp.sin(0.5 * (w0 - w))
    c = 2.0 * plus * minus
    d = minus**2 + plus**2
    beta = jnp.sqrt(A) * alpha
    peak = lax.complex(c, alpha * A * s) / lax.complex(c, (alpha / A) * s)
    shelf_up = (A + 1) * c + (A - 1) * d
    shelf_down = (A + 1) * c - (A - 1) * d
    two_beta_s = 2.0 * beta * s
    low = lax.complex(A * shelf_up, A * two_beta_s) / lax.complex(
        shelf_down, two_beta_s
    )
    high = lax.complex(A * shelf_down, A * two_beta_s) / lax.complex(
        shelf_up, two_beta_s
    )
    return low[0] * jnp.prod(peak[1:-1], axis=0) * high[-1]


class DaspParametricEQ(AbstractRangedEffect):
    r"""dasp-pytorch's parametric equaliser, `dasp_pytorch.functional.parametric_eq`.

    A low shelf, four peaking bands and a high shelf (RBJ cookbook sections,
    as [`rbj_section`][retrax.filters.rbj_section] builds them), applied by
    frequency sampling over the whole signal as dasp applies them (see the
    module `_dasp_eq`: a circular convolution over
    $2^{\lceil\log_2(2T-1)\rceil}$ samples, not the recursion of
    [`ParametricEQ`][retrax.filters.ParametricEQ]). This is retrax's port
    of dasp's definition, for its users and for models built on it.

    **Arguments:**

    - `freqs`: the six cutoff frequencies in Hz (low shelf, bands 0 to 3,
      high shelf), each in $(0, f_s/2)$; default the middles of dasp's
      ranges.
    - `gains_db`: the six gains in dB, finite (default 0).
    - `qs`: the six Q factors, each $> 0$ (default 3.05, the middle of
      dasp's range).
    - `sample_rate`: $f_s$ in Hz, a Python number above 26 kHz (dasp's top
      band spans 12 kHz to 1 kHz below Nyquist; static).

    The normalised vector is dasp's `ParametricEQ(sample_rate).
    process_normalized` vector, in its order (section by section: gain,
    cutoff, Q) and over its ranges (gains $[-20, 20]$ dB, Qs $[0.1, 6]$,
    cutoffs per section: low shelf $[20, 2000]$ Hz, bands $[80, 2000]$,
    $[2000, 8000]$, $[8000, 12000]$, $[12000, f_s/2 - 1000]$, high shelf
    $[4000, f_s/2 - 1000]$; all linear): `from_normalised(p,
    sample_rate=...)` is `retrax.effects.from_dasp(DaspParametricEQ, p,
    ...)`. Values outside the ranges but valid (a cutoff below Nyquist)
    filter as dasp's function would; `to_normalised` refuses them. Invalid
    values raise an error naming the field (also under `jax.jit`). Not
    streamable: `zi` must be `None` and `zf` is `None`. Takes `(time,)` or
    `(channels, time)`, every channel through the same filter.
    """

    freqs: Float[Array, " 6"]
    gains_db: Float[Array, " 6"]
    qs: Float[Array, " 6"]
    sample_rate: float = eqx.field(static=True)

    def __init__(
        self,
        freqs: Shaped[ArrayLike, " 6"] | Sequence[float | int] | None = None,
        gains_db: Shaped[ArrayLike, " 6"] | Sequence[float | int] | None = None,
        qs: Shaped[ArrayLike, " 6"] | Sequence[float | int] | None = None,
        sample_rate: float | int = 44_100.0,
    ):
        self.sample_rate = _check_rate(sample_rate)
        ranges = dasp_eq_ranges(self.sample_rate)
        middles = {n: 0.5 * (lo + hi) for n, (lo, hi) in ranges.items()}
        if freqs is None:
            freqs = [middles[f"{s}_cutoff_freq"] for s in SECTIONS]
        if gains_db is None:
            gains_db = [0.0] * 6
        if qs is None:
            qs = [middles[f"{s}_q_factor"] for s in SECTIONS]
        values = {}
        for name, value in (("freqs", freqs), ("gains_db", gains_db), ("qs", qs)):
            value = jnp.asarray(value, float)
            if value.shape != (6,):
                raise ValueError(
                    f"`{name}` must hold one value per section (low shelf, band0 "
                    f"to band3, high shelf), shape (6,), got shape {value.shape}."
                )
            values[name] = value
        nyquist = self.sample_rate / 2
        self.freqs = check_init_range("freqs", values["freqs"], 0.0, nyquist)
        self.gains_db = check_init_range("gains_db", values["gains_db"])
        self.qs = check_init_range("qs", values["qs"], 0.0)

    def ranges(self) -> dict[str, Range]:
        """dasp's ranges, in dasp's order (see the class), keyed by entry:
        `gains_db[k]`, `freqs[k]`, `qs[k]` for section `k`."""
        fields = {"gain_db": "gains_db", "cutoff_freq": "freqs", "q_factor": "qs"}
        ranges = {}
        for name, (lo, hi) in dasp_eq_ranges(self.sample_rate).items():
            section, _, kind = name.partition("_")
            if section in ("low", "high"):
                section, kind = f"{section}_shelf", kind.removeprefix("shelf_")
            k = SECTIONS.index(section)
            ranges[f"{fields[kind]}[{k}]"] = Range(float(lo), float(hi))
        return ranges

    def _checked(self) -> tuple[Array, Array, Array]:
        """The fields, checked to be valid (also under `jax.jit`)."""
        freqs, gains_db, qs = (
            as_inexact(n, getattr(self, n)) for n in ("freqs", "gains_db", "qs")
        )
        freqs = check_init_range("freqs", freqs, 0.0, self.sample_rate / 2)
        gains_db = check_init_range("gains_db", gains_db)
        return freqs, gains_db, check_init_range("qs", qs, 0.0)

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "DaspParametricEQ":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(
        self, theta: Shaped[ArrayLike, " params"]
    ) -> "DaspParametricEQ":
        return logit_with_unconstrained(self, theta)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], None]:
        """Equalise `x` `(time,)` or `(channels, time)` by dasp's frequency
        sampling; with `return_zf`, `(y, None)`."""
        no_state(zi)
        x = signal(x)
        t = x.shape[-1]
        if t == 0:
            return output(x, None, return_zf)
        dtype = x.dtype
        freqs, gains_db, qs = (v.astype(dtype) for v in self._checked())
        n = _fft_length(t)
        h = _response(freqs, gains_db, qs, self.sample_rate, n, dtype)
        y = jnp.fft.irfft(jnp.fft.rfft(x, n) * h, n)[..., :t]
        return output(y.astype(dtype), None, return_zf)
