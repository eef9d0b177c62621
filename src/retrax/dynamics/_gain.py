"""Gain computers of compressors, expanders and limiters (torchcomp's formulas)."""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._misc import as_inexact, result_dtype
from .._validate import check_in_range, check_signal, check_zi
from ..ops import ballistics, linear_recurrence
from ._convert import amp2db, db2amp


_Param = Shaped[ArrayLike, ""] | Shaped[ArrayLike, " time"] | float


def _signal(name, x):
    x = as_inexact(name, x)
    check_signal(name, x)
    return x


def _coef(name, value):
    """A smoothing coefficient in (0, 1] (see `ms2coef`), checked at run time."""
    return check_in_range(name, as_inexact(name, value), 0.0, 1.0, high_open=False)


def avg(
    x: Shaped[ArrayLike, " time"],
    coef: _Param,
    zi: Shaped[ArrayLike, ""] | float | None = None,
    *,
    return_zf: bool = False,
) -> Float[Array, " time"] | tuple[Float[Array, " time"], Float[Array, ""]]:
    r"""One-pole running average $y_n = c\, x_n + (1 - c)\, y_{n-1}$.

    torchcomp's `avg(rms, avg_coef)` is the `zi=None` (zero start) case. It is
    a `linear_recurrence` and shares its adjoint derivative rule.

    **Arguments:**

    - `x`: the signal, shape `(T,)` (typically a squared or absolute level).
    - `coef`: the coefficient $c \in (0, 1]$, a scalar or per sample `(T,)`
      (see `ms2coef`). Checked at run time.
    - `zi`: the previous output $y_{-1}$, a scalar; defaults to 0.
    - `return_zf`: also return the last output, to stream in blocks.

    **Returns:**

    The average, shape `(T,)`, or `(y, zf)`.
    """
    x = _signal("x", x)
    coef = _coef("coef", coef)
    dtype = result_dtype(x, coef)
    coef = coef.astype(dtype)
    return linear_recurrence(
        coef * x.astype(dtype), decay=1 - coef, zi=zi, return_zf=return_zf
    )


def _knee(hard, slope, over, knee):
    r"""One branch of the static curve in dB with a soft knee: the hard
    knee's curve `hard` where $|\mathrm{over}| \ge W/2$ ($W$ = `knee`), and
    inside the knee the quadratic
    $\mathrm{slope}\,(\mathrm{over} + W/2)^2 / (2W)$, which meets the
    lines on either side with their values and slopes.

    `over` is the level's distance past the threshold in the direction the
    branch acts (above a compressor's, below an expander's) and
    `slope < 0` the branch's slope there. A zero knee never selects the
    quadratic: values and derivatives are `hard`'s.
    """
    half = knee / 2
    # the quadratic divides by the knee: where the knee is 0 it is never
    # selected, and it must not put a nan into the derivatives there
    safe = jnp.where(knee > 0, knee, 1.0)
    quadratic = slope * (over + half) ** 2 / (2 * safe)
    return jnp.where(jnp.abs(over) < half, quadratic, hard)


def compexp_gain(
    x_rms: Shaped[ArrayLike, " time"],
    comp_thresh: _Param,
    comp_ratio: _Param,
    exp_thresh: _Param,
    exp_ratio: _Param,
    at: _Param,
    rt: _Param,
    *,
    knee_db: _Param = 0.0,
    zi: Shaped[ArrayLike, ""] | float | None = None,
    return_zf: bool = False,
) -> Float[Array, " time"] | tuple[Float[Array, " time"], Float[Array, ""]]:
    r"""Compressor-expander gain: a static curve in dB, then ballistics.

    With $L_n = 20 \log_{10} x_n$ (the level in dB of `x_rms`) and the hard
    knee (`knee_db = 0`, the default),

    $$g_n = \min\bigl(0,\ (1 - 1/R_c)(T_c - L_n),\ (1 - 1/R_e)(T_e - L_n)\bigr),$$

    the linear gain $10^{g_n/20}$ is smoothed by `ballistics` with attack
    coefficient `at` (used while the gain falls) and release `rt`, starting
    from unity gain. Same formula and argument order as torchcomp 0.2's
    `compexp_gain`, for one signal (batch with `jax.vmap`).

    A soft knee of width $W$ = `knee_db` > 0 replaces each corner of the
    curve by the quadratic of Giannoulis, Massberg and Reiss (2012), as in
    dasp-pytorch's compressor: the compressor's branch is

    $$c_n = \begin{cases}
    0 & L_n - T_c \le -W/2, \\
    (1/R_c - 1)\,(L_n - T_c + W/2)^2 / (2W) & |L_n - T_c| < W/2, \\
    (1/R_c - 1)\,(L_n - T_c) & L_n - T_c \ge W/2,
    \end{cases}$$

    (the output level $L_n + c_n$ is the paper's gain computer), the
    expander's is the same curve mirrored about its threshold,

    $$e_n = \begin{cases}
    0 & L_n - T_e \ge W/2, \\
    (1 - 1/R_e)\,(L_n - T_e - W/2)^2 / (2W) & |L_n - T_e| < W/2, \\
    (1 - 1/R_e)\,(T_e - L_n) & L_n - T_e \le -W/2,
    \end{cases}$$

    and $g_n = \min(c_n, e_n)$. Both have a continuous slope at the knee's
    ends; with $W = 0$ the curve is torchcomp's, values and derivatives
    exactly.

    Unlike torchcomp, silence is allowed: levels are floored at the smallest
    normal number of the dtype (about -758 dB in float32), so the gain and
    its gradients stay finite when `x_rms` is 0.

    **Arguments:**

    - `x_rms`: the level detector's output (e.g. `jnp.sqrt(avg(x**2, c))`),
      shape `(T,)`, non-negative.
    - `comp_thresh`, `exp_thresh`: thresholds in dB, finite.
    - `comp_ratio`: compression ratio, > 1.
    - `exp_ratio`: expansion ratio, in (0, 1).
    - `at`, `rt`: attack and release coefficients in (0, 1] (see `ms2coef`),
      scalars or per sample.
    - `knee_db`: the knee's width $W$ in dB, finite and $\ge 0$, shared by
      the compressor and the expander; a scalar or per sample.
    - `zi`: the gain before the first sample; defaults to 1.
    - `return_zf`: also return the last gain, to stream in blocks.

    **Returns:**

    The linear gain, shape `(T,)`, or `(gain, zf)`. Multiply it with the
    signal (and a makeup gain) to compress.

    Parameters out of range or non-finite raise an error naming the argument
    (also under `jax.jit`); `nan` levels pass through to the gain.
    """
    x_rms = _signal("x_rms", x_rms)
    comp_thresh = check_in_range("comp_thresh", as_inexact("comp_thresh", comp_thresh))
    comp_ratio = check_in_range("comp_ratio", as_inexact("comp_ratio", comp_ratio), 1.0)
    exp_thresh = check_in_range("exp_thresh", as_inexact("exp_thresh", exp_thresh))
    exp_ratio = check_in_range(
        "exp_ratio", as_inexact("exp_ratio", exp_ratio), 0.0, 1.0
    )
    at, rt = _coef("at", at), _coef("rt", rt)
    knee_db = check_in_range(
        "knee_db", as_inexact("knee_db", knee_db), 0.0, None, low_open=False
    )
    dtype = result_dtype(
        x_rms, comp_thresh, comp_ratio, exp_thresh, exp_ratio, at, rt, knee_db
    )
    comp_thresh, comp_ratio, exp_thresh, exp_ratio, knee_db = (
        jnp.asarray(v, dtype)
        for v in (comp_thresh, comp_ratio, exp_thresh, exp_ratio, knee_db)
    )
    level = amp2db(x_rms.astype(dtype), floor=float(jnp.finfo(dtype).tiny))
    # Outside the knees, torchcomp's expressions (so its values and, where
    # the level sits exactly on a threshold, its derivatives): the
    # expander's line is positive above its threshold, where the
    # compressor's branch, at most 0, is the smaller.
    comp = _knee(
        jnp.minimum((1 - 1 / comp_ratio) * (comp_thresh - level), 0.0),
        1 / comp_ratio - 1,
        level - comp_thresh,
        knee_db,
    )
    exp = _knee(
        (1 - 1 / exp_ratio) * (exp_thresh - level),
        1 - 1 / exp_ratio,
        exp_thresh - level,
        knee_db,
    )
    gain_db = jnp.minimum(comp, exp)
    zi = jnp.ones((), dtype) if zi is None else zi
    return ballistics(db2amp(gain_db), at, rt, zi, return_zf=return_zf)


def limiter_gain(
    x: Shaped[ArrayLike, " time"],
    threshold: _Param,
    at: _Param,
    rt: _Param,
    *,
    zi: Shaped[ArrayLike, " 2"] | None = None,
    return_zf: bool = False,
) -> Float[Array, " time"] | tuple[Float[Array, " time"], Float[Array, " 2"]]:
    r"""Limiter gain: a peak detector, a hard ceiling, and gain ballistics.

    The peak $p$ = `ballistics(|x|, at=rt, rt=at)` (attack and release
    swapped, so the detector attacks on a rising level) starting at 0; the
    static gain is $f_n = \min(1, 10^{\theta/20} / p_n)$; the output is
    `ballistics(f, at, rt)` starting at 1. torchcomp 0.2's `limiter_gain`
    for one signal.

    Unlike torchcomp (whose gradients are NaN when the input starts silent,
    where $p = 0$), the ceiling is evaluated only where the peak exceeds the
    threshold, so gradients are finite on silent and constant input.

    **Arguments:**

    - `x`: the signal, shape `(T,)`.
    - `threshold`: the ceiling in dB, <= 0.
    - `at`, `rt`: attack and release coefficients in (0, 1].
    - `zi`: the state `[peak, gain]` before the first sample; defaults to
      `[0, 1]`.
    - `return_zf`: also return the final `[peak, gain]` state.

    **Returns:**

    The linear gain, shape `(T,)`, or `(gain, zf)`.

    Parameters out of range or non-finite raise an error naming the argument
    (also under `jax.jit`); `nan` samples of `x` pass through to the gain.
    """
    x = _signal("x", x)
    threshold = check_in_range(
        "threshold", as_inexact("threshold", threshold), None, 0.0, high_open=False
    )
    # Checked here, by the caller's names: the peak detector swaps them.
    at, rt = _coef("at", at), _coef("rt", rt)
    dtype = result_dtype(x, threshold, at, rt)
    zi = check_zi(zi, (2,), "[peak, gain]")
    zi = jnp.asarray([0.0, 1.0], dtype) if zi is None else zi.astype(dtype)
    peak, peak_zf = ballistics(jnp.abs(x.astype(dtype)), rt, at, zi[0], return_zf=True)
    ceiling = db2amp(threshold.astype(dtype))
    # not `peak > ceiling`: a nan peak (from a nan in `x`) must reach the gain
    over = ~(peak <= ceiling)
    static = jnp.where(over, ceiling / jnp.where(over, peak, 1.0), 1.0)
    gain, gain_zf = ballistics(static, at, rt, zi[1], return_zf=True)
    if not return_zf:
        return gain
    return gain, jnp.stack([peak_zf, gain_zf])
