"""Argument checks and input policy shared by the signal-processing areas
(ops, dynamics, filters, synth): the cases, and the checks each area's test
module runs over its own cases (`area_cases`).

- Physical parameters out of range raise an error naming the user's argument,
  eagerly and under `jax.jit` (sample rates are static: `ValueError`).
- Non-finite coefficients and parameters raise; non-finite signals pass
  through, as in scipy.signal.
- Integer inputs are accepted (promoted as JAX promotes them); empty signals
  give empty outputs.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_close
from retrax.dynamics import (
    amp2db,
    avg,
    coef2ms,
    compexp_gain,
    db2amp,
    limiter_gain,
    ms2coef,
)
from retrax.filters import (
    SVF,
    Biquad,
    Compressor,
    ParametricEQ,
    StateSpaceFilter,
    biquad_denominator,
    lpc2rc,
    rbj_section,
    rc2lpc,
    svf,
)
from retrax.ops import (
    allpole,
    ballistics,
    diag_state_space,
    fir,
    linear_recurrence,
    state_space,
)
from retrax.synth import fm_operator, phase, sine


SR = 8_000.0
T = 16
BAD_AT = 5  # where the bad sample goes
RUNTIME = eqx.EquinoxRuntimeError

X = jnp.asarray(np.random.default_rng(0).normal(size=T))
FREQ = jnp.full(T, 440.0)
A_ = jnp.asarray  # noqa: N816


def _modules():
    return {
        "SVF": SVF(1_000.0, 1.0, SR),
        "Biquad": Biquad(jnp.asarray([1.0, -0.3, 0.1]), 0.6, 0.8),
        "ParametricEQ": ParametricEQ(
            [100.0, 1_000.0, 3_000.0], [3.0, -4.0, 2.0], None, SR
        ),
        "Compressor": Compressor(threshold_db=-20.0, sample_rate=SR),
        "StateSpaceFilter": StateSpaceFilter(2, jax.random.key(1)),
    }


MODULES = _modules()


def _both(f, args, eager_exc, jit_exc, match):
    """`f(*args)` raises `eager_exc` eagerly and `jit_exc` under `filter_jit`,
    both with a message matching `match`."""
    with pytest.raises(eager_exc, match=match):
        f(*args)
    with pytest.raises(jit_exc, match=match):
        eqx.filter_jit(f)(*args)


# ------------------------------------------------------ physical parameters

# (id, function, array arguments (traced under jit), exception eagerly, under
# jit, message)
PARAMETER_CASES = [
    (
        "ms2coef ms<0",
        lambda ms: ms2coef(ms, 44_100),
        (A_(-5.0),),
        RUNTIME,
        RUNTIME,
        r"`ms` must be finite and lie in \[0.0, inf\)",
    ),
    (
        "ms2coef sr<0",
        lambda ms: ms2coef(ms, -44_100),
        (A_(10.0),),
        ValueError,
        ValueError,
        "`sr` must be a positive, finite number",
    ),
    (
        "ms2coef sr=0",
        lambda ms: ms2coef(ms, 0),
        (A_(10.0),),
        ValueError,
        ValueError,
        "`sr`",
    ),
    (
        "coef2ms coef>1",
        lambda c: coef2ms(c, 44_100),
        (A_(1.5),),
        RUNTIME,
        RUNTIME,
        r"`coef` must be finite and lie in \(0.0, 1.0\]",
    ),
    (
        "coef2ms sr<0",
        lambda c: coef2ms(c, -1.0),
        (A_(0.5),),
        ValueError,
        ValueError,
        "`sr`",
    ),
    (
        "ballistics at<0",
        lambda x, at: ballistics(x, at, 0.5),
        (X, A_(-0.5)),
        RUNTIME,
        RUNTIME,
        r"`at` must be finite and lie in \(0.0, 1.0\]",
    ),
    (
        "ballistics rt>1",
        lambda x, rt: ballistics(x, 0.5, rt),
        (X, A_(1.7)),
        RUNTIME,
        RUNTIME,
        "`rt` must be finite",
    ),
    (
        "ballistics per-sample at",
        lambda x, at: ballistics(x, at, 0.5),
        (X, jnp.full(T, 0.5).at[3].set(0.0)),
        RUNTIME,
        RUNTIME,
        "`at` must be finite",
    ),
    (
        "compexp at>1",
        lambda at, rt: compexp_gain(jnp.abs(X), -10.0, 4.0, -60.0, 0.5, at, rt),
        (A_(2.5), A_(-1.0)),
        RUNTIME,
        RUNTIME,
        "`at` must be finite",
    ),
    (
        "compexp rt<0",
        lambda rt: compexp_gain(jnp.abs(X), -10.0, 4.0, -60.0, 0.5, 0.1, rt),
        (A_(-1.0),),
        RUNTIME,
        RUNTIME,
        "`rt` must be finite",
    ),
    # the limiter's peak detector swaps at and rt: the message must not
    (
        "limiter rt>1",
        lambda rt: limiter_gain(X, -3.0, 0.1, rt),
        (A_(1.5),),
        RUNTIME,
        RUNTIME,
        "`rt` must be finite",
    ),
    (
        "limiter at<0",
        lambda at: limiter_gain(X, -3.0, at, 0.1),
        (A_(-0.1),),
        RUNTIME,
        RUNTIME,
        "`at` must be finite",
    ),
    (
        "Compressor sample_rate=0",
        lambda: Compressor(sample_rate=0.0),
        (),
        ValueError,
        ValueError,
        "`sample_rate` must be a positive, finite number",
    ),
    # raised at construction, not at the call (which named an internal `coef`)
    (
        "Compressor sample_rate<0",
        lambda: Compressor(sample_rate=-44_100.0),
        (),
        ValueError,
        ValueError,
        "`sample_rate` must be a positive",
    ),
    (
        "Compressor attack_ms<0",
        lambda a: Compressor(attack_ms=a),
        (A_(-1.0),),
        ValueError,
        RUNTIME,
        r"`attack_ms` must be finite and lie in \(0.0, inf\)",
    ),
    (
        "Compressor release_ms=0",
        lambda r: Compressor(release_ms=r),
        (A_(0.0),),
        ValueError,
        RUNTIME,
        "`release_ms` must be finite",
    ),
    (
        "Compressor rms_ms nan",
        lambda r: Compressor(rms_ms=r),
        (A_(np.nan),),
        ValueError,
        RUNTIME,
        "`rms_ms` must be finite",
    ),
    (
        "Compressor ratio<1",
        lambda r: Compressor(ratio=r),
        (A_(0.5),),
        ValueError,
        RUNTIME,
        r"`ratio` must be finite and lie in \(1.0, inf\)",
    ),
    (
        "Compressor exp_ratio>1",
        lambda r: Compressor(exp_ratio=r),
        (A_(2.0),),
        ValueError,
        RUNTIME,
        "`exp_ratio` must be finite",
    ),
    (
        "Compressor knee_db<0",
        lambda k: Compressor(knee_db=k),
        (A_(-3.0),),
        ValueError,
        RUNTIME,
        r"`knee_db` must be finite and lie in \[0.0, inf\)",
    ),
    (
        "Compressor threshold inf",
        lambda t: Compressor(threshold_db=t),
        (A_(np.inf),),
        ValueError,
        RUNTIME,
        "`threshold_db` must be finite",
    ),
    (
        "rbj freq>nyquist",
        lambda f: rbj_section("peak", f, 3.0, 1.0, 44_100),
        (A_(30_000.0),),
        RUNTIME,
        RUNTIME,
        r"`freq` must be finite and lie in \(0.0, 22050.0\)",
    ),
    (
        "rbj freq<0",
        lambda f: rbj_section("lowshelf", f, 3.0, 1.0, 44_100),
        (A_(-10.0),),
        RUNTIME,
        RUNTIME,
        "`freq` must be finite",
    ),
    (
        "rbj q=0",
        lambda q: rbj_section("peak", 1_000.0, 3.0, q, 44_100),
        (A_(0.0),),
        RUNTIME,
        RUNTIME,
        "`q` must be finite",
    ),
    (
        "rbj sample_rate<0",
        lambda f: rbj_section("peak", f, 3.0, 1.0, -44_100),
        (A_(1_000.0),),
        ValueError,
        ValueError,
        "`sample_rate` must be a positive",
    ),
    # blamed `cutoff` before
    (
        "SVF sample_rate<0",
        lambda: SVF(1_000.0, 1.0, sample_rate=-44_100.0),
        (),
        ValueError,
        ValueError,
        "`sample_rate` must be a positive",
    ),
    (
        "svf sample_rate<0",
        lambda x: svf(x, 1_000.0, 1.0, -44_100.0),
        (X,),
        ValueError,
        ValueError,
        "`sample_rate` must be a positive",
    ),
    (
        "SVF cutoff>nyquist",
        lambda c: SVF(c, 1.0, SR),
        (A_(5_000.0),),
        ValueError,
        RUNTIME,
        r"`cutoff` must be finite and lie in \(0.0, 4000.0\)",
    ),
    (
        "SVF q<0",
        lambda q: SVF(1_000.0, q, SR),
        (A_(-1.0),),
        ValueError,
        RUNTIME,
        "`q` must be finite",
    ),
    # reported the range "(0, -22050.0) Hz" before
    (
        "ParametricEQ sample_rate<0",
        lambda: ParametricEQ([100.0, 1_000.0], sample_rate=-44_100.0),
        (),
        ValueError,
        ValueError,
        "`sample_rate` must be a positive",
    ),
    (
        "ParametricEQ freqs>nyquist",
        lambda f: ParametricEQ(f, sample_rate=SR),
        (A_([100.0, 5_000.0]),),
        ValueError,
        RUNTIME,
        r"`freqs` must be finite and lie in \(0.0, 4000.0\)",
    ),
    (
        "ParametricEQ qs<0",
        lambda q: ParametricEQ([100.0, 1_000.0], None, q, SR),
        (A_([1.0, -1.0]),),
        ValueError,
        RUNTIME,
        "`qs` must be finite",
    ),
    (
        "Biquad radius>max",
        lambda r: Biquad(jnp.ones(3), r),
        (A_(1.2),),
        ValueError,
        RUNTIME,
        r"`radius` must be finite and lie in \(0.0, 0.999\)",
    ),
    (
        "Biquad max_radius",
        lambda: Biquad(jnp.ones(3), 0.5, 1.0, 1.5),
        (),
        ValueError,
        ValueError,
        "`max_radius` must lie in",
    ),
    (
        "phase sample_rate inf",
        lambda f: phase(f, float("inf")),
        (FREQ,),
        ValueError,
        ValueError,
        "`sample_rate` must be a positive",
    ),
    (
        "phase sample_rate array<0",
        lambda f, sr: phase(f, sr),
        (FREQ, A_(-1.0)),
        RUNTIME,
        RUNTIME,
        r"`sample_rate` must be finite and lie in \(0.0, inf\)",
    ),
]


# ------------------------------------------ non-finite parameters: they raise


def _with_makeup(value):
    return eqx.tree_at(lambda m: m.makeup_db, MODULES["Compressor"], value)


def _with_d(value):
    return eqx.tree_at(lambda m: m.d, MODULES["StateSpaceFilter"], value)


_I2 = jnp.eye(2) * 0.5
_B, _C, _D = jnp.ones((2, 1)), jnp.ones((1, 2)), jnp.ones((1, 1))

# (id, f(bad), bad value, the argument the message must name)
NONFINITE_PARAMETER_CASES = [
    ("allpole a", lambda a: allpole(X, a), A_([0.5, np.nan]), "a"),
    (
        "linear_recurrence decay",
        lambda d: linear_recurrence(X, decay=d),
        A_(np.inf),
        "decay",
    ),
    ("ballistics at", lambda at: ballistics(X, at, 0.1), A_(np.nan), "at"),
    ("ballistics rt", lambda rt: ballistics(X, 0.1, rt), A_(np.inf), "rt"),
    ("fir b", lambda b: fir(X, b=b), A_([1.0, np.inf]), "b"),
    (
        "state_space A",
        lambda A: state_space(X[:, None], A=A, B=_B, C=_C, D=_D),
        _I2.at[0, 1].set(np.nan),
        "A",
    ),
    (
        "state_space B",
        lambda B: state_space(X[:, None], A=_I2, B=B, C=_C, D=_D),
        _B.at[0].set(np.inf),
        "B",
    ),
    (
        "state_space C",
        lambda C: state_space(X[:, None], A=_I2, B=_B, C=C, D=_D),
        _C.at[0, 0].set(np.nan),
        "C",
    ),
    (
        "state_space D",
        lambda D: state_space(X[:, None], A=_I2, B=_B, C=_C, D=D),
        _D.at[0, 0].set(np.nan),
        "D",
    ),
    (
        "diag_state_space a",
        lambda a: diag_state_space(X[:, None], a=a, B=_B, C=_C, D=None),
        A_([0.5, np.inf]),
        "a",
    ),
    ("avg coef", lambda c: avg(X**2, c), A_(np.nan), "coef"),
    (
        "compexp comp_thresh",
        lambda t: compexp_gain(jnp.abs(X), t, 4.0, -60.0, 0.5, 0.1, 0.1),
        A_(np.nan),
        "comp_thresh",
    ),
    (
        "compexp comp_ratio",
        lambda r: compexp_gain(jnp.abs(X), -10.0, r, -60.0, 0.5, 0.1, 0.1),
        A_(np.inf),
        "comp_ratio",
    ),
    (
        "compexp exp_thresh",
        lambda t: compexp_gain(jnp.abs(X), -10.0, 4.0, t, 0.5, 0.1, 0.1),
        A_(-np.inf),
        "exp_thresh",
    ),
    (
        "compexp exp_ratio",
        lambda r: compexp_gain(jnp.abs(X), -10.0, 4.0, -60.0, r, 0.1, 0.1),
        A_(np.nan),
        "exp_ratio",
    ),
    (
        "limiter threshold",
        lambda t: limiter_gain(X, t, 0.1, 0.1),
        A_(np.nan),
        "threshold",
    ),
    ("ms2coef ms", lambda ms: ms2coef(ms, 44_100), A_(np.inf), "ms"),
    ("coef2ms coef", lambda c: coef2ms(c, 44_100), A_(np.nan), "coef"),
    ("svf cutoff", lambda c: svf(X, c, 1.0, SR), A_(np.nan), "cutoff"),
    ("svf q", lambda q: svf(X, 1_000.0, q, SR), jnp.ones(T).at[3].set(np.inf), "q"),
    (
        "rbj gain_db",
        lambda g: rbj_section("highshelf", 1_000.0, g, 0.7, SR),
        A_(np.nan),
        "gain_db",
    ),
    ("rc2lpc k", rc2lpc, A_([0.5, np.nan]), "k"),
    ("lpc2rc a", lpc2rc, A_([0.5, np.inf]), "a"),
    (
        "biquad_denominator radius",
        lambda r: biquad_denominator(r, 1.0),
        A_(np.nan),
        "radius",
    ),
    (
        "biquad_denominator angle",
        lambda a: biquad_denominator(0.5, a),
        A_(np.inf),
        "angle",
    ),
    ("phase freq", lambda f: phase(f, SR), FREQ.at[BAD_AT].set(np.nan), "freq"),
    ("phase phase0", lambda p: phase(FREQ, SR, p), A_(np.inf), "phase0"),
    ("sine freq", lambda f: sine(f, SR), FREQ.at[BAD_AT].set(np.inf), "freq"),
    (
        "fm_operator level",
        lambda lv: fm_operator(FREQ, SR, level=lv),
        jnp.ones(T).at[BAD_AT].set(np.nan),
        "level",
    ),
    ("Biquad b", lambda b: Biquad(b)(X), A_([1.0, np.nan, 0.0]), "b"),
    ("Compressor makeup_db", lambda v: _with_makeup(v)(X), A_(np.nan), "makeup_db"),
    ("StateSpaceFilter d", lambda v: _with_d(v)(X), A_(np.inf), "d"),
]


# -------------------------------------- non-finite signals: they pass through

# (id, f(x) for a real signal x of length T)
SIGNAL_CASES = [
    ("allpole", lambda x: allpole(x, A_([-0.5, 0.2]))),
    ("linear_recurrence", lambda x: linear_recurrence(x, decay=0.7)),
    ("ballistics", lambda x: ballistics(jnp.abs(x), 0.3, 0.05)),
    ("fir", lambda x: fir(x, b=A_([1.0, -0.5, 0.25]))),
    ("state_space", lambda x: state_space(x, A=_I2, B=_B, C=_C, D=_D)),
    (
        "diag_state_space",
        lambda x: diag_state_space(x, a=A_([0.5, -0.3]), B=_B, C=_C, D=None),
    ),
    ("avg", lambda x: avg(x**2, 0.3)),
    (
        "compexp_gain",
        lambda x: compexp_gain(jnp.abs(x), -10.0, 4.0, -40.0, 0.5, 0.3, 0.05),
    ),
    ("limiter_gain", lambda x: limiter_gain(x, -6.0, 0.3, 0.05)),
    ("amp2db", lambda x: amp2db(jnp.abs(x))),
    ("db2amp", db2amp),
    ("svf", lambda x: svf(x, 1_000.0, 1.0, SR, "bandpass")),
    ("fm_operator modulation", lambda x: fm_operator(FREQ, SR, modulation=x)),
    *((name, module) for name, module in MODULES.items()),
]


# An infinite level is a limit, not an error, for the gain computers: the gain
# falls towards 0 there (full attenuation), and stays finite.
_GAIN_COMPUTERS = ("compexp_gain", "limiter_gain")


# ---------------------------------------------------------- integer inputs

_IX = jnp.asarray(np.random.default_rng(1).integers(-3, 4, size=T))
_IABS = jnp.abs(_IX) + 1
_IFREQ = jnp.full(T, 440)
_F = jnp.float64  # the default float with x64 (enabled in conftest)

# (id, f with integer inputs, f with the same values as floats)
INTEGER_CASES = [
    (
        "allpole",
        lambda: allpole(_IX, jnp.asarray([0, 0])),
        lambda: allpole(_IX.astype(_F), jnp.asarray([0.0, 0.0])),
    ),
    (
        "linear_recurrence",
        lambda: linear_recurrence(_IX, decay=0),
        lambda: linear_recurrence(_IX.astype(_F), decay=0.0),
    ),
    (
        "ballistics",
        lambda: ballistics(_IX, 1, 1, 2),
        lambda: ballistics(_IX.astype(_F), 1.0, 1.0, 2.0),
    ),
    (
        "fir",
        lambda: fir(_IX, b=jnp.asarray([1, -2, 1])),
        lambda: fir(_IX.astype(_F), b=jnp.asarray([1.0, -2.0, 1.0])),
    ),
    (
        "state_space",
        lambda: state_space(
            _IX[:, None],
            A=jnp.zeros((2, 2), int),
            B=jnp.ones((2, 1), int),
            C=jnp.ones((1, 2), int),
            D=jnp.ones((1, 1), int),
        ),
        lambda: state_space(
            _IX[:, None].astype(_F),
            A=jnp.zeros((2, 2)),
            B=jnp.ones((2, 1)),
            C=jnp.ones((1, 2)),
            D=jnp.ones((1, 1)),
        ),
    ),
    (
        "diag_state_space",
        lambda: diag_state_space(
            _IX[:, None],
            a=jnp.asarray([1, 0]),
            B=jnp.ones((2, 1), int),
            C=jnp.ones((1, 2), int),
            D=None,
        ),
        lambda: diag_state_space(
            _IX[:, None].astype(_F),
            a=jnp.asarray([1.0, 0.0]),
            B=jnp.ones((2, 1)),
            C=jnp.ones((1, 2)),
            D=None,
        ),
    ),
    ("avg", lambda: avg(_IX, 1), lambda: avg(_IX.astype(_F), 1.0)),
    (
        "compexp_gain",
        lambda: compexp_gain(_IABS, -10, 4, -60, 0.5, 1, 1),
        lambda: compexp_gain(_IABS.astype(_F), -10.0, 4.0, -60.0, 0.5, 1.0, 1.0),
    ),
    (
        "limiter_gain",
        lambda: limiter_gain(_IX, -3, 1, 1),
        lambda: limiter_gain(_IX.astype(_F), -3.0, 1.0, 1.0),
    ),
    ("amp2db", lambda: amp2db(_IABS), lambda: amp2db(_IABS.astype(_F))),
    ("db2amp", lambda: db2amp(_IX), lambda: db2amp(_IX.astype(_F))),
    ("ms2coef", lambda: ms2coef(10, 44_100), lambda: ms2coef(10.0, 44_100.0)),
    ("coef2ms", lambda: coef2ms(1, 44_100), lambda: coef2ms(1.0, 44_100.0)),
    (
        "svf",
        lambda: svf(_IX, 1_000, 1, 44_100),
        lambda: svf(_IX.astype(_F), 1_000.0, 1.0, 44_100.0),
    ),
    (
        "rbj_section",
        lambda: rbj_section("peak", 1_000, 3, 1, 44_100),
        lambda: rbj_section("peak", 1_000.0, 3.0, 1.0, 44_100.0),
    ),
    (
        "rc2lpc",
        lambda: rc2lpc(jnp.asarray([0, 0])),
        lambda: rc2lpc(jnp.asarray([0.0, 0.0])),
    ),
    (
        "lpc2rc",
        lambda: lpc2rc(jnp.asarray([0, 0])),
        lambda: lpc2rc(jnp.asarray([0.0, 0.0])),
    ),
    (
        "biquad_denominator",
        lambda: biquad_denominator(0, 1),
        lambda: biquad_denominator(0.0, 1.0),
    ),
    (
        "phase",
        lambda: phase(_IFREQ, 44_100, 0),
        lambda: phase(_IFREQ.astype(_F), 44_100.0, 0.0),
    ),
    (
        "fm_operator",
        lambda: fm_operator(_IFREQ, 44_100, _IX, 2),
        lambda: fm_operator(_IFREQ.astype(_F), 44_100.0, _IX.astype(_F), 2.0),
    ),
    ("SVF", lambda: SVF(1_000, 1)(_IX), lambda: SVF(1_000.0, 1.0)(_IX.astype(_F))),
    (
        "Biquad",
        lambda: Biquad(jnp.asarray([1, 0, 0]))(_IX),
        lambda: Biquad(jnp.asarray([1.0, 0.0, 0.0]))(_IX.astype(_F)),
    ),
    (
        "ParametricEQ",
        lambda: ParametricEQ([100, 1_000], [3, -3], [1, 1], 44_100)(_IX),
        lambda: ParametricEQ([100.0, 1_000.0], [3.0, -3.0], [1.0, 1.0], 44_100.0)(
            _IX.astype(_F)
        ),
    ),
    (
        "Compressor",
        lambda: Compressor(-20, 4, 5, 100, 0, -120, 0.5, 10, 44_100)(_IX),
        lambda: Compressor(-20.0, 4.0, 5.0, 100.0, 0.0, -120.0, 0.5, 10.0, 44_100.0)(
            _IX.astype(_F)
        ),
    ),
    (
        "StateSpaceFilter",
        lambda: MODULES["StateSpaceFilter"](_IX),
        lambda: MODULES["StateSpaceFilter"](_IX.astype(_F)),
    ),
]


# ------------------------------------------------------------ empty signals

_EMPTY = jnp.zeros(0)

# (id, f(x) for an empty x)
EMPTY_CASES = [
    ("allpole", lambda x: allpole(x, A_([0.5]))),
    ("linear_recurrence", lambda x: linear_recurrence(x, decay=0.5)),
    ("ballistics", lambda x: ballistics(x, 0.5, 0.5)),
    ("fir", lambda x: fir(x, b=A_([1.0, 2.0]))),
    ("state_space", lambda x: state_space(x, A=_I2, B=_B, C=_C, D=_D)),
    (
        "diag_state_space",
        lambda x: diag_state_space(x, a=A_([0.5, 0.1]), B=_B, C=_C, D=None),
    ),
    ("avg", lambda x: avg(x, 0.5)),
    ("compexp_gain", lambda x: compexp_gain(x, -10.0, 4.0, -60.0, 0.5, 0.5, 0.5)),
    ("limiter_gain", lambda x: limiter_gain(x, -3.0, 0.5, 0.5)),
    ("svf", lambda x: svf(x, 1_000.0, 1.0, SR)),
    ("phase", lambda x: phase(x, SR)),
    ("sine", lambda x: sine(x, SR)),
    ("fm_operator", lambda x: fm_operator(x, SR, modulation=x, level=x)),
    *((name, module) for name, module in MODULES.items()),
]


# ------------------------------------------------- how a run-time check costs


AREAS = ("ops", "dynamics", "filters", "synth")


def _area_of(case_id):
    import importlib

    name = case_id.split()[0]
    name = {
        "compexp": "compexp_gain",
        "limiter": "limiter_gain",
        "rbj": "rbj_section",
    }.get(name, name)
    found = [
        area
        for area in AREAS
        if hasattr(importlib.import_module(f"retrax.{area}"), name)
    ]
    if len(found) != 1:
        raise LookupError(f"case {case_id!r}: its function is in {found}")
    return found[0]


def area_cases(cases, area, *, keep_id=False):
    """The `cases` (tuples whose first entry is an id that starts with the
    public name under test) of the functions of `retrax.<area>`, as
    `pytest.param`s with that id (also passed as the first value with
    `keep_id`)."""
    import pytest as _pytest

    return [
        _pytest.param(*(case if keep_id else case[1:]), id=case[0])
        for case in cases
        if _area_of(case[0]) == area
    ]


class InputPolicy:
    """The input policy's tests over one area's cases: a test module
    subclasses this as `TestInputPolicy` with `area` set to its area."""

    area: str

    _TABLES = {
        "test_invalid_parameter_names_the_argument": (
            "f, args, eager_exc, jit_exc, match",
            PARAMETER_CASES,
            False,
        ),
        "test_nonfinite_parameter_raises": (
            "f, bad, name",
            NONFINITE_PARAMETER_CASES,
            False,
        ),
        "test_nonfinite_signal_passes_through": ("name, f", SIGNAL_CASES, True),
        "test_integer_inputs_promote_to_the_default_float": (
            "f_int, f_float",
            INTEGER_CASES,
            False,
        ),
        "test_empty_signal_gives_empty_output": ("f", EMPTY_CASES, False),
    }

    def pytest_generate_tests(self, metafunc):
        argnames, cases, keep_id = self._TABLES[metafunc.function.__name__]
        metafunc.parametrize(argnames, area_cases(cases, self.area, keep_id=keep_id))

    @pytest.mark.loud
    def test_invalid_parameter_names_the_argument(
        self, f, args, eager_exc, jit_exc, match
    ):
        _both(f, args, eager_exc, jit_exc, match)

    @pytest.mark.loud
    def test_nonfinite_parameter_raises(self, f, bad, name):
        match = rf"`{name}` (has non-finite|must be finite)"
        # a module built from concrete values raises ValueError at construction
        _both(f, (bad,), (ValueError, RUNTIME), RUNTIME, match)

    @pytest.mark.loud
    @pytest.mark.parametrize("bad", [np.nan, np.inf], ids=["nan", "inf"])
    def test_nonfinite_signal_passes_through(self, name, f, bad):
        # Like scipy.signal: no error; the samples before the bad one are exact,
        # and the bad one reaches the output (a step later without feedthrough).
        x = X.at[BAD_AT].set(bad)
        clean = f(X)
        assert bool(jnp.all(jnp.isfinite(clean)))
        for out in (f(x), eqx.filter_jit(f)(x)):
            assert out.shape == clean.shape
            assert_close(out[:BAD_AT], clean[:BAD_AT])
            if name in _GAIN_COMPUTERS and bad == np.inf:
                assert bool(jnp.all(jnp.isfinite(out)))
                assert float(out[BAD_AT]) < float(clean[BAD_AT])
            else:
                assert not bool(jnp.all(jnp.isfinite(out[BAD_AT : BAD_AT + 2])))

    def test_integer_inputs_promote_to_the_default_float(self, f_int, f_float):
        out, ref = f_int(), f_float()
        assert out.dtype == ref.dtype == _F
        assert_close(out, ref, rtol=1e-15)

    def test_empty_signal_gives_empty_output(self, f):
        for out in (f(_EMPTY), eqx.filter_jit(f)(_EMPTY)):
            assert out.shape == (0,) and out.dtype == _EMPTY.dtype
