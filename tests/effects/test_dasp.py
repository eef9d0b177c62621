"""dasp-pytorch's compressor, stereo bus, widener and panner, by their
definitions: against dasp-pytorch 0.0.1 (directly when installed, else
stored values) in float64 and float32, their gradients, transformations and
bad input. Then dasp's normalised parameter vectors through
`retrax.effects.from_dasp` / `to_dasp` against dasp's `process_normalized`
for every effect with a dasp counterpart, the dasp equaliser, and the
reverb's fresh noise per call."""

import importlib.util
import json
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest

import retrax.effects as fx
from helpers import assert_close, unchecked


DATA = pathlib.Path(__file__).parents[1] / "data"
_spec = importlib.util.spec_from_file_location(
    "dasp_reference", DATA / "dasp_reference.py"
)
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)
COMP = reference.compressor_cases()
BUS = reference.bus_cases()
STEREO = reference.stereo_cases()


@pytest.fixture(scope="module")
def expected():
    """dasp's values: computed now if dasp-pytorch is installed, otherwise
    the stored ones, after checking they belong to these inputs."""
    if importlib.util.find_spec("dasp_pytorch") is not None:
        return reference.dasp_values(COMP, BUS, STEREO)
    stored = json.loads((DATA / "dasp_reference.json").read_text())
    prints = reference.input_fingerprints(COMP, BUS, STEREO)
    for kind in ("compressor", "bus", "stereo"):
        for case, want in prints[kind].items():
            np.testing.assert_allclose(want, stored["fingerprints"][kind][case])
    return stored["values"]


# dasp's parameter names, as `DaspCompressor` spells them
RETRAX_NAMES = {n: "makeup_db" if n == "makeup_gain_db" else n for n in reference.NAMES}


def _compressor(case, dtype) -> fx.DaspCompressor:
    params = {RETRAX_NAMES[n]: np.asarray(v, dtype) for n, v in case["params"].items()}
    return fx.DaspCompressor(
        **params,
        sample_rate=case["sample_rate"],
        lookahead_samples=case["lookahead"],
    )


def _signal(case, dtype):
    """The case's signal as retrax takes it: `(time,)` mono, `(2, time)`."""
    x = case["x"].astype(dtype)
    return x[0] if x.shape[0] == 1 else x


@pytest.mark.parametrize("case", list(COMP))
def test_compressor_equals_dasp_float64(expected, case):
    y = jax.jit(lambda c, x: c(x))(
        _compressor(COMP[case], np.float64), _signal(COMP[case], np.float64)
    )
    assert y.dtype == jnp.float64
    # the stored values hold 13 significant digits
    assert_close(np.ravel(y), expected["compressor"][case]["float64"], rtol=1e-12)


def _float32_case(expected, case):
    y = jax.jit(lambda c, x: c(x))(
        _compressor(COMP[case], np.float32), _signal(COMP[case], np.float32)
    )
    assert y.dtype == jnp.float32
    values = expected["compressor"][case]
    # dasp in float32, and dasp's definition (its float64 values)
    assert_close(np.ravel(y), values["float32"], rtol=1e-5)
    assert_close(np.ravel(y), values["float64"], rtol=1e-5)


@pytest.mark.parametrize("case", list(COMP))
def test_compressor_equals_dasp_float32(expected, case):
    _float32_case(expected, case)


@pytest.mark.float32
@pytest.mark.parametrize("case", list(COMP))
def test_compressor_equals_dasp_float32_session(expected, case):
    _float32_case(expected, case)


@pytest.mark.parametrize("case", list(COMP))
def test_compressor_gradient_equals_dasp_float64(expected, case):
    comp = _compressor(COMP[case], np.float64)
    x = jnp.asarray(_signal(COMP[case], np.float64))
    w = jnp.asarray(reference.weights(np.shape(COMP[case]["x"])))
    w = w[0] if x.ndim == 1 else w

    def scalar(comp, x):
        return jnp.sum(w * comp(x))

    grad_comp, grad_x = jax.jit(jax.grad(scalar, argnums=(0, 1)))(comp, x)
    want = expected["compressor"][case]["grad"]
    got = {n: getattr(grad_comp, RETRAX_NAMES[n]) for n in reference.NAMES}
    got["x"] = reference.fingerprint(grad_x)
    # dasp's gradients with a hard knee (the low ends) are NaN: its knee
    # branch divides by 2 knee_db at every sample before the mask picks
    # none of them; retrax's are finite, and equal to dasp's elsewhere
    assert all(np.isfinite(v).all() for v in got.values())
    # relative to the case's gradient scale: with a ratio of 1 the gain is 0
    # and the attack's gradient is rounding (1e-18)
    scale = np.nanmax(np.abs([want[n] for n in reference.NAMES]))
    for name, value in got.items():
        w = np.asarray(want[name])
        if np.isnan(w).any():
            assert case.startswith("low ends"), name
            continue
        atol = 1e-9 * (np.abs(w).max() if name == "x" else scale)
        np.testing.assert_allclose(value, w, rtol=1e-9, atol=atol, err_msg=name)
    # dasp never reads the release time
    assert grad_comp.release_ms == 0


def test_compressor_is_linked_and_vmaps():
    case = COMP["random 1 (stereo)"]
    comp = _compressor(case, np.float64)
    x = jnp.asarray(case["x"])
    y = comp(x)
    # one gain for both channels: the gain of their sum
    g = 10 ** ((comp.gain_db(x) + comp.makeup_db) / 20)
    assert_close(y, x * g, rtol=1e-14)
    assert_close(comp.gain_db(x), comp.gain_db(x[0] + x[1]), rtol=0, atol=0)
    # a batch of compressors built from normalised vectors, as a controller's
    # output, equals the compressors one by one
    p = jax.random.uniform(jax.random.key(0), (3, 6))
    comps = eqx.filter_vmap(
        lambda p: fx.DaspCompressor.from_normalised(p, sample_rate=16_000.0)
    )(p)
    xs = jnp.stack([x, 0.5 * x, -x])
    ys = eqx.filter_jit(eqx.filter_vmap(lambda c, x: c(x)))(comps, xs)
    for k in range(3):
        one = fx.DaspCompressor.from_normalised(p[k], sample_rate=16_000.0)
        assert_close(ys[k], one(xs[k]), rtol=1e-12)


def test_normalised_vector_is_dasps():
    comp = _compressor(COMP["random 0 (mono)"], np.float64)
    want = [
        (COMP["random 0 (mono)"]["params"][n] - lo) / (hi - lo)
        for n, (lo, hi) in reference.RANGES.items()
    ]
    np.testing.assert_allclose(comp.to_normalised(), want, rtol=1e-12)
    back = comp.with_normalised(comp.to_normalised())
    for n in RETRAX_NAMES.values():
        np.testing.assert_allclose(getattr(back, n), getattr(comp, n), rtol=1e-12)
    assert comp.n_params == 6
    assert list(comp.ranges()) == list(RETRAX_NAMES.values())


def test_smoothing_is_dasps_frequency_sampling():
    # dasp's lowpass is a circular convolution over N = 2^ceil(log2(2T - 1))
    # samples with the N-periodic impulse response (1 - a) a^n / (1 - a^N),
    # written here as a sum
    from retrax.effects._dasp_compressor import _fft_length, _smooth

    t = 12
    n = _fft_length(t)
    assert n == 32
    g = jnp.asarray(np.random.default_rng(0).standard_normal(t))
    alpha = 0.9
    h = (1 - alpha) * alpha ** np.arange(n) / (1 - alpha**n)
    padded = np.concatenate([np.asarray(g), np.zeros(n - t)])
    want = [sum(padded[m] * h[(k - m) % n] for m in range(n)) for k in range(t)]
    assert_close(_smooth(g, jnp.asarray(alpha)), want, rtol=1e-13)
    assert [_fft_length(t) for t in (1, 2, 3, 4, 5, 512, 513)] == [
        1,
        4,
        8,
        8,
        16,
        1024,
        2048,
    ]


@pytest.mark.slow
def test_compressor_gradients_check_and_stay_finite_at_the_ends():
    x = jnp.asarray(np.random.default_rng(1).uniform(-1, 1, (2, 16)))
    comp = fx.DaspCompressor(-30.0, 5.0, 20.0, 50.0, 6.0, 3.0, sample_rate=8_000.0)
    jax.test_util.check_grads(
        lambda c, x: c(x), (comp, x), order=2, modes=("fwd", "rev"), eps=1e-6
    )
    # the ends of the ranges: a hard knee (its branch divides by the knee)
    # and a ratio of 1
    for knee, ratio in ((0.0, 5.0), (0.0, 1.0), (12.0, 1.0)):
        c = fx.DaspCompressor(-30.0, ratio, 20.0, 50.0, knee, 3.0, sample_rate=8e3)
        g_c, g_x = jax.grad(lambda c, x: jnp.sum(c(x) ** 2), argnums=(0, 1))(c, x)
        assert all(np.isfinite(leaf).all() for leaf in jax.tree.leaves((g_c, g_x))), (
            knee,
            ratio,
        )
    # a level exactly at the threshold with a hard knee (dasp: 0/0)
    c = fx.DaspCompressor(-6.0, 4.0, 20.0, 50.0, 0.0, 0.0, sample_rate=8e3)
    at = jnp.full(4, 10 ** (-6 / 20))
    assert np.isfinite(c(at)).all()


def test_compressor_lookahead_delays_the_signal_not_the_gain():
    case = COMP["random 0 (mono)"]
    x = jnp.asarray(_signal(case, np.float64))
    comp = _compressor(case, np.float64)
    late = fx.DaspCompressor(
        **{n: getattr(comp, n) for n in RETRAX_NAMES.values()},
        sample_rate=case["sample_rate"],
        lookahead_samples=5,
    )
    g = 10 ** ((comp.gain_db(x) + comp.makeup_db) / 20)
    want = jnp.concatenate([jnp.zeros(5), x[:-5]]) * g
    assert_close(late(x), want, rtol=1e-14)


def test_compressor_bad_settings_raise_naming_them():
    with pytest.raises(ValueError, match="ratio"):
        fx.DaspCompressor(ratio=0.5)
    with pytest.raises(ValueError, match="attack_ms"):
        fx.DaspCompressor(attack_ms=1.0)
    with pytest.raises(ValueError, match="knee_db"):
        fx.DaspCompressor(knee_db=-1.0)
    with pytest.raises(ValueError, match="lookahead_samples"):
        fx.DaspCompressor(lookahead_samples=-1)
    with pytest.raises(ValueError, match="eps"):
        fx.DaspCompressor(eps=0.0)
    with pytest.raises(ValueError, match="sample_rate"):
        fx.DaspCompressor(sample_rate=-1.0)
    comp = fx.DaspCompressor()
    # the suite's type checker rejects a state first (a TypeError naming it)
    with pytest.raises((ValueError, TypeError), match="zi"):
        comp(jnp.ones(8), zi=jnp.zeros(()))
    moved = eqx.tree_at(lambda c: c.threshold_db, comp, jnp.asarray(10.0))
    with pytest.raises(Exception, match="threshold_db"):
        moved(jnp.ones(8))
    with pytest.raises(Exception, match="threshold_db"):
        jax.jit(lambda c: c(jnp.ones(8)))(moved)
    with pytest.raises(ValueError, match=r"\(time,\)"):
        comp(jnp.ones((2, 3, 8)))
    assert comp(jnp.zeros(0)).shape == (0,)


def test_compressor_old_makeup_spelling_warns_and_still_works():
    new = fx.DaspCompressor(makeup_db=3.0, sample_rate=8e3)
    with pytest.warns(DeprecationWarning, match="makeup_db"):
        old = fx.DaspCompressor(makeup_gain_db=3.0, sample_rate=8e3)
    x = jnp.asarray(np.random.default_rng(2).uniform(-1, 1, 32))
    assert_close(old(x), new(x), rtol=0, atol=0)
    with pytest.warns(DeprecationWarning, match="makeup_db"):
        assert old.makeup_gain_db == 3.0
    # `eqx.tree_at` through the old name moves the new field
    with pytest.warns(DeprecationWarning, match="makeup_db"):
        moved = eqx.tree_at(lambda c: c.makeup_gain_db, new, jnp.asarray(5.0))
    assert moved.makeup_db == 5.0
    with pytest.raises(ValueError, match="makeup_db"):
        fx.DaspCompressor(makeup_db=1.0, makeup_gain_db=1.0)


@pytest.mark.parametrize("case", list(BUS))
def test_stereo_bus_equals_dasp(expected, case):
    x, send = BUS[case]["x"], BUS[case]["send_db"]
    y64 = jax.jit(fx.stereo_bus)(x, send)
    assert y64.shape == (2, x.shape[-1]) and y64.dtype == jnp.float64
    assert_close(np.ravel(y64), expected["bus"][case]["float64"], rtol=1e-12)
    y32 = fx.stereo_bus(x.astype(np.float32), send.astype(np.float32))
    assert y32.dtype == jnp.float32
    assert_close(np.ravel(y32), expected["bus"][case]["float32"], rtol=1e-5)


def test_stereo_bus_gradient_and_bad_input():
    x, send = (jnp.asarray(v) for v in BUS["3 tracks"].values())
    w = jnp.asarray(reference.weights((2, x.shape[-1])))
    grad_x, grad_s = jax.grad(
        lambda x, s: jnp.sum(w * fx.stereo_bus(x, s)), argnums=(0, 1)
    )(x, send)
    sends = 10 ** (send / 20)
    assert_close(grad_x, sends[:, None, None] * w, rtol=1e-14)
    want = np.log(10) / 20 * sends * jnp.einsum("ct,kct->k", w, x)
    assert_close(grad_s, want, rtol=1e-12)
    with pytest.raises(ValueError, match="transpose"):
        fx.stereo_bus(jnp.ones((2, 3, 8)), jnp.zeros(2))
    with pytest.raises(ValueError, match="send_db"):
        fx.stereo_bus(jnp.ones((3, 2, 8)), jnp.zeros(2))


@pytest.mark.parametrize("case", list(STEREO))
def test_widener_and_panner_equal_dasp(expected, case):
    x, mono = STEREO[case]["x"], STEREO[case]["mono"]
    widener = fx.DaspStereoWidener(STEREO[case]["width"])
    panner = fx.DaspStereoPanner(STEREO[case]["pan"])
    for dtype, rtol in ((np.float64, 1e-12), (np.float32, 1e-5)):
        key = np.dtype(dtype).name
        y = jax.jit(lambda e, x: e(x))(widener, x.astype(dtype))
        assert y.shape == (2, x.shape[-1]) and y.dtype == dtype
        assert_close(np.ravel(y), expected["widener"][case][key], rtol=rtol)
        y = jax.jit(lambda e, x: e(x))(panner, mono.astype(dtype))
        assert y.shape == (2, mono.shape[-1]) and y.dtype == dtype
        assert_close(np.ravel(y), expected["panner"][case][key], rtol=rtol)


def test_dasp_widener_is_a_gain_and_retrax_widener_where_that_reaches():
    x = jnp.asarray(STEREO["2: 0.500"]["x"])
    for w in (0.0, 0.2, 0.5, 2 / 3):
        dasp = fx.DaspStereoWidener(w)(x)
        ours = 2 * (1 - w) * fx.StereoWidener(w / (1 - w))(x)
        assert_close(dasp, ours, rtol=1e-14)
    assert_close(fx.DaspStereoWidener(0.5)(x), x, rtol=1e-15)


@pytest.mark.slow
def test_dasp_panner_law_and_gradients():
    mono = jnp.asarray(STEREO["0: 0.000"]["mono"])
    # the hard ends are the sine law's; the centre is -4.5 dB
    assert_close(fx.DaspStereoPanner(0.0)(mono), fx.StereoPanner(-1.0)(mono))
    assert_close(fx.DaspStereoPanner(1.0)(mono), fx.StereoPanner(1.0)(mono), 1e-15)
    centre = fx.DaspStereoPanner(0.5)(jnp.ones(1))
    np.testing.assert_allclose(20 * np.log10(centre), -4.515, atol=1e-3)
    # derivatives in the pan, at the ends too (where dasp's square root of 0
    # gives NaN): against central differences of the definition
    for pan in (0.0, 0.3, 1.0):
        grad = jax.jacfwd(lambda p: fx.DaspStereoPanner(p)(jnp.ones(1))[:, 0])(
            jnp.asarray(pan)
        )
        assert np.isfinite(grad).all()

        def law(p):
            t = p * np.pi / 2
            left = (np.pi / 2 - t) * (2 / np.pi) * np.cos(t)
            right = t * (2 / np.pi) * np.sin(t)
            return np.sqrt(np.maximum([left, right], 0))

        h = 1e-6
        lo, hi = max(pan - h, 0.0), min(pan + h, 1.0)
        np.testing.assert_allclose(grad, (law(hi) - law(lo)) / (hi - lo), atol=1e-5)
    jax.test_util.check_grads(
        lambda p: fx.DaspStereoPanner(p)(mono), (jnp.asarray(0.3),), order=2
    )
    jax.test_util.check_grads(
        lambda w, x: fx.DaspStereoWidener(w)(x),
        (jnp.asarray(0.3), jnp.asarray(STEREO["0: 0.000"]["x"][:, :8])),
        order=2,
    )


def test_dasp_stereo_bad_input_raises():
    with pytest.raises(ValueError, match="width"):
        fx.DaspStereoWidener(1.5)
    with pytest.raises(ValueError, match="pan"):
        fx.DaspStereoPanner(-0.1)
    with pytest.raises(ValueError, match="mono"):
        fx.DaspStereoPanner()(jnp.ones((2, 8)))
    with pytest.raises(ValueError, match="stereo"):
        fx.DaspStereoWidener()(jnp.ones((3, 8)))
    moved = eqx.tree_at(lambda e: e.pan, fx.DaspStereoPanner(), jnp.asarray(2.0))
    with pytest.raises(Exception, match="pan"):
        jax.jit(lambda e: e(jnp.ones(8)))(moved)
    p = fx.DaspStereoPanner(0.25)
    np.testing.assert_allclose(p.to_normalised(), [0.25])
    assert fx.DaspStereoWidener.from_normalised(jnp.asarray([0.75])).width == 0.75


# dasp's normalised parameter vectors, through `fx.from_dasp` / `fx.to_dasp`

VECTORS = reference.vector_cases()
VECTOR_TYPES = {
    "gain": fx.Gain,
    "distortion": fx.Distortion,
    "parametric_eq": fx.DaspParametricEQ,
    "compressor": fx.DaspCompressor,
    "reverb": fx.NoiseShapedReverb,
    "panner": fx.DaspStereoPanner,
    "widener": fx.DaspStereoWidener,
}


@pytest.fixture(scope="module")
def reverb_noise():
    return reference.reverb_noise()


@pytest.fixture(scope="module")
def expected_vectors(reverb_noise):
    """dasp's `process_normalized` outputs and its ranges: computed now if
    dasp-pytorch is installed, otherwise the stored ones, after checking
    they belong to these inputs."""
    if importlib.util.find_spec("dasp_pytorch") is not None:
        return {
            "vectors": reference.dasp_vector_values(VECTORS),
            "vector ranges": reference.dasp_vector_ranges(),
        }
    stored = json.loads((DATA / "dasp_reference.json").read_text())
    prints = reference.vector_fingerprints(VECTORS)
    for name, want in prints.items():
        np.testing.assert_allclose(want, stored["vector fingerprints"][name])
    return stored


def _options(name, noise):
    if name == "reverb":
        return {"white_noise": noise, "sample_rate": 44_100.0}
    if name in ("parametric_eq", "compressor"):
        return {"sample_rate": 44_100.0}
    return {}


def _dasp_door_outputs(name, noise, dtype) -> list[np.ndarray]:
    """retrax's outputs for every vector of the case, mono then stereo, in
    the stored order; the effects built by `fx.from_dasp` (a template) and
    `fx.with_dasp` under `jax.vmap`."""
    case = VECTORS[name]
    p = jnp.asarray(case["p"], dtype)
    template = fx.from_dasp(VECTOR_TYPES[name], p[0], **_options(name, noise))

    def one(p, x):
        effect = fx.with_dasp(template, p)
        if name == "panner":
            return jax.vmap(effect)(x)  # tracks -> (tracks, 2, T)
        return effect(x[0] if x.shape[0] == 1 else x)

    run = jax.jit(jax.vmap(one, in_axes=(0, None)))
    mono = run(p, jnp.asarray(case["mono"], dtype))
    stereo = run(p, jnp.asarray(case["stereo"], dtype))
    assert mono.dtype == stereo.dtype == dtype
    return [y for pair in zip(mono, stereo, strict=True) for y in pair]


# float64 against dasp's float64 values (13 digits stored); the reverb's is
# dasp's float32 band filters (it rounds them in both dtypes)
FLOAT64_RTOL = {"reverb": 1e-7}


@pytest.mark.parametrize("name", list(VECTORS))
def test_dasp_vectors_equal_process_normalized_float64(
    expected_vectors, reverb_noise, name
):
    ys = _dasp_door_outputs(name, reverb_noise, jnp.float64)
    want = expected_vectors["vectors"][name]["float64"]
    assert len(ys) == len(want) == 2 * reference.N_VECTORS
    for k, (y, w) in enumerate(zip(ys, want, strict=True)):
        y, w = np.ravel(y), np.asarray(w)
        err = np.max(np.abs(y - w)) / np.max(np.abs(w))
        assert err <= FLOAT64_RTOL.get(name, 1e-12), (k, err)


def _float32_vectors(expected_vectors, reverb_noise, name):
    ys = _dasp_door_outputs(name, reverb_noise, jnp.float32)
    values = expected_vectors["vectors"][name]
    for k, y in enumerate(ys):
        y = np.ravel(y)
        # relative to the case's largest output: dasp's definition (its
        # float64 values), and dasp in float32; dasp's float32 equaliser is
        # itself up to 8e-5 off its definition (the rounded coefficients'
        # response near 0 Hz, see `DaspParametricEQ`): there, within that
        # and 1e-5
        want64, want32 = (np.asarray(values[key][k]) for key in ("float64", "float32"))
        scale = np.max(np.abs(want64))
        assert np.max(np.abs(y - want64)) <= 1e-5 * scale, k
        own = np.max(np.abs(want32 - want64)) if name == "parametric_eq" else 0.0
        assert np.max(np.abs(y - want32)) <= 1e-5 * scale + own, k


@pytest.mark.parametrize("name", list(VECTORS))
def test_dasp_vectors_equal_process_normalized_float32(
    expected_vectors, reverb_noise, name
):
    _float32_vectors(expected_vectors, reverb_noise, name)


@pytest.mark.float32
@pytest.mark.parametrize("name", list(VECTORS))
def test_dasp_vectors_equal_process_normalized_float32_session(
    expected_vectors, reverb_noise, name
):
    _float32_vectors(expected_vectors, reverb_noise, name)


@pytest.mark.parametrize("name", list(VECTORS))
def test_dasp_parameters_are_dasps_names_ranges_and_order(expected_vectors, name):
    got = fx.dasp_parameters(VECTOR_TYPES[name], 44_100)
    want = expected_vectors["vector ranges"][name]
    assert list(got) == list(want)
    np.testing.assert_allclose(list(got.values()), list(want.values()), rtol=0)


@pytest.mark.parametrize("name", list(VECTORS))
def test_to_dasp_inverts_from_dasp(name):
    cls = VECTOR_TYPES[name]
    p = jnp.asarray(VECTORS[name]["p"][:4])
    options = _options(name, None)
    if name == "reverb":
        # T60s of 0.12 to 1.3 s: inside retrax's range
        options = {"key": jax.random.key(0), "length": 8192, "n_taps": 15}
    effects = [fx.from_dasp(cls, q, **options) for q in p]
    back = jnp.stack([fx.to_dasp(e) for e in effects])
    assert_close(back, p, rtol=1e-12)
    # the physical values are dasp's denormalisation, p (high - low) + low
    ranges = np.asarray(list(fx.dasp_parameters(cls, 44_100).values()))
    physical = p * (ranges[:, 1] - ranges[:, 0]) + ranges[:, 0]
    if name == "compressor":
        got = [e.threshold_db for e in effects]
        assert_close(got, physical[:, 0], rtol=1e-14)
    if name == "parametric_eq":
        assert_close([e.freqs[3] for e in effects], physical[:, 10], rtol=1e-14)
        assert_close([e.qs[0] for e in effects], physical[:, 2], rtol=1e-14)
    if name == "reverb":
        want = 3 * np.log(10) * 8191 / 44_100 / (10 * physical[:, 12:24] + 1)
        assert_close([e.t60s for e in effects], want, rtol=1e-14)
        x = jnp.ones(16)
        assert all(np.isfinite(e(x)).all() for e in effects)


def test_dasp_eq_vector_and_retrax_eq_vector_keep_their_meanings():
    # retrax's own normalised vector keeps its order and ranges: all 0.5 is
    # every section at 651 Hz, Q 1; dasp's all 0.5 is dasp's middles
    ours = fx.ParametricEQ([1e3] * 6, sample_rate=44_100).with_normalised(
        jnp.full(18, 0.5)
    )
    assert_close(ours.freqs, np.full(6, np.sqrt(20.0 * 0.48 * 44_100)), rtol=1e-12)
    assert_close(ours.qs, np.ones(6), rtol=1e-12)
    dasps = fx.from_dasp(fx.ParametricEQ, jnp.full(18, 0.5), sample_rate=44_100)
    exact = fx.from_dasp(fx.DaspParametricEQ, jnp.full(18, 0.5), sample_rate=44_100)
    middles = [1010.0, 1040.0, 5000.0, 10_000.0, 16_525.0, 12_525.0]
    for eq in (dasps, exact):
        assert_close(eq.freqs, middles, rtol=1e-14)
        assert_close(eq.qs, np.full(6, 3.05), rtol=1e-14)
        assert_close(eq.gains_db, np.zeros(6), atol=1e-14)
    # the DaspParametricEQ's own normalised vector is dasp's
    p = jnp.asarray(VECTORS["parametric_eq"]["p"][0])
    built = fx.DaspParametricEQ.from_normalised(p, sample_rate=44_100.0)
    assert_close(built.to_normalised(), p, rtol=1e-12)
    assert_close(fx.to_dasp(built), p, rtol=1e-12)
    # the recursion and dasp's frequency sampling agree where the responses
    # die out within the FFT's padding (bands at 500 Hz and up, Q 0.7: the
    # padding is 2,048 samples)
    x = jnp.asarray(np.random.default_rng(3).standard_normal(2048))
    sections = dict(freqs=[500.0, 1e3, 3e3, 9e3, 13e3, 5e3], qs=[0.7] * 6)
    gains = dict(gains_db=[3.0, -6.0, 4.0, 2.0, -3.0, 5.0])
    recursion = fx.ParametricEQ(**sections, **gains, sample_rate=44_100)(x)
    sampled = fx.DaspParametricEQ(**sections, **gains, sample_rate=44_100)(x)
    assert_close(sampled, recursion, rtol=1e-9)


def test_dasp_eq_response_is_the_ratio_of_its_coefficients_polynomials():
    # an independent reference: numpy's FFT of the RBJ coefficients in
    # float64 (dasp's `fft_freqz`), the cascade applied by frequency sampling
    from retrax.filters import rbj_section

    rng = np.random.default_rng(4)
    x = rng.standard_normal(40)
    freqs, gains, qs = (
        [20.0, 90.0, 2e3, 8e3, 2e4, 4e3],
        rng.uniform(-20, 20, 6),
        [
            0.1,
            6.0,
            1.0,
            0.5,
            2.0,
            3.0,
        ],
    )
    shapes = ["lowshelf"] + ["peak"] * 4 + ["highshelf"]
    n = 128  # 2^ceil(log2(2 * 40 - 1))
    h = np.ones(n // 2 + 1, complex)
    for shape, f, g, q in zip(shapes, freqs, gains, qs, strict=True):
        sos = np.asarray(rbj_section(shape, f, g, q, 44_100.0))
        h *= np.fft.rfft(sos[:3], n) / np.fft.rfft(sos[3:], n)
    want = np.fft.irfft(np.fft.rfft(x, n) * h, n)[:40]
    eq = fx.DaspParametricEQ(freqs, gains, qs, sample_rate=44_100.0)
    assert_close(eq(jnp.asarray(x)), want, rtol=1e-10)


@pytest.mark.slow
def test_dasp_eq_derivatives():
    rng = np.random.default_rng(4)
    eq = fx.DaspParametricEQ(
        [20.0, 90.0, 2e3, 8e3, 2e4, 4e3], rng.uniform(-20, 20, 6), [0.5] * 6
    )
    x = jnp.asarray(rng.standard_normal(16))
    jax.test_util.check_grads(
        jax.jit(lambda e, x: e(x)), (eq, x), order=2, modes=("fwd", "rev")
    )


@pytest.mark.loud
def test_dasp_vectors_of_the_wrong_layout_raise_naming_dasps_order():
    with pytest.raises(ValueError, match="low_shelf_gain_db, low_shelf_cutoff_freq"):
        fx.from_dasp(fx.DaspParametricEQ, jnp.full(17, 0.5))
    # a batch: the library's message (the suite's type checker rejects it
    # first otherwise)
    with pytest.raises(ValueError, match=r"threshold_db, ratio, attack_ms.*\(1, 6\)"):
        unchecked(fx.from_dasp)(fx.DaspCompressor, jnp.full((1, 6), 0.5))
    with pytest.raises(ValueError, match="band0_gain, band1_gain"):
        fx.from_dasp(fx.NoiseShapedReverb, jnp.zeros(24), key=jax.random.key(0))
    with pytest.raises(ValueError, match="filter_vmap"):
        unchecked(fx.with_dasp)(fx.Gain(), jnp.zeros((3, 1)))
    with pytest.raises(TypeError, match="no dasp-pytorch counterpart"):
        fx.from_dasp(fx.Delay, jnp.zeros(3))
    with pytest.raises(ValueError, match="sample_rate"):
        fx.from_dasp(fx.DaspParametricEQ, jnp.full(18, 0.5), sample_rate=16_000)
    with pytest.raises(ValueError, match="sample_rate"):
        fx.dasp_parameters(fx.ParametricEQ, 16_000)
    # entries outside [0, 1]: eagerly and under jit
    for f in (
        lambda p: fx.from_dasp(fx.Gain, p).gain_db,
        lambda p: fx.with_dasp(fx.DaspStereoPanner(), p).pan,
    ):
        with pytest.raises(Exception, match=r"`p`.*\[0, 1\]"):
            f(jnp.asarray([1.5]))
        with pytest.raises(Exception, match=r"`p`.*\[0, 1\]"):
            jax.jit(f)(jnp.asarray([-0.5]))


@pytest.mark.loud
def test_to_dasp_refuses_values_outside_dasps_ranges():
    # retrax's distortion reaches 40 dB of drive, dasp's 24
    with pytest.raises(Exception, match="`gain_db` lies outside dasp"):
        fx.to_dasp(fx.Distortion(30.0))
    with pytest.raises(Exception, match="`gain_db` lies outside dasp"):
        jax.jit(fx.to_dasp)(fx.Distortion(30.0))
    # a T60 shorter than dasp's fastest decay (0.93 s at 65,536 samples)
    reverb = fx.NoiseShapedReverb(t60s=0.5, key=jax.random.key(0), length=65_536)
    with pytest.raises(Exception, match="`band0_decay` lies outside dasp"):
        fx.to_dasp(reverb)
    eq = fx.ParametricEQ([100.0, 400.0, 1e3, 9e3, 13e3, 5e3], sample_rate=44_100)
    with pytest.raises(Exception, match="`band1_cutoff_freq` lies outside dasp"):
        fx.to_dasp(eq)
    assert_close(fx.to_dasp(fx.Distortion(24.0)), [1.0], rtol=0)
    # a value set as a Python number (as `eqx.tree_at` may) reads back too
    moved = eqx.tree_at(lambda e: e.gain_db, fx.Gain(), 6.0)
    assert_close(fx.to_dasp(moved), [30.0 / 48.0], rtol=1e-15)


def test_reverb_takes_dasps_whole_decay_range():
    p = jnp.concatenate([jnp.full(12, 0.5), jnp.zeros(12), jnp.ones(1)])
    reverb = fx.from_dasp(fx.NoiseShapedReverb, p, key=jax.random.key(0))
    # decay 0: the envelope e^{-n / (L - 1)}, a T60 of 3 ln 10 (L - 1) / f_s
    want = 3 * np.log(10) * 65_535 / 44_100
    assert_close(reverb.t60s, np.full(12, want), rtol=1e-14)
    assert 10.26 < want < 10.27
    assert reverb.ranges()["t60s"].high == pytest.approx(want, rel=1e-15)
    assert np.isfinite(reverb(jnp.ones(32))).all()
    # retrax's own range is [0.05, 10] s for short responses, and raised to
    # dasp's slowest decay for long ones; beyond it is refused
    assert fx.NoiseShapedReverb(key=jax.random.key(0), length=64).ranges()[
        "t60s"
    ].high == pytest.approx(10.0)
    with pytest.raises(ValueError, match="`t60s` must be finite and lie in"):
        fx.NoiseShapedReverb(t60s=10.3, key=jax.random.key(0))


def test_reverb_fresh_noise_per_call_from_a_key():
    reverb = fx.NoiseShapedReverb(key=jax.random.key(1), length=256, n_taps=15)
    x = jnp.asarray(np.random.default_rng(5).standard_normal(48))
    fresh = jax.jit(lambda r, k: r(x, key=k, return_zf=True))
    own = jax.jit(lambda r: r(x, return_zf=True))
    # the same key: the room a reverb built from that key holds (and its
    # state, the input's history, is the same)
    built = fx.NoiseShapedReverb(key=jax.random.key(7), length=256, n_taps=15)
    (y, zf), (want, want_zf) = fresh(reverb, jax.random.key(7)), own(built)
    assert_close(y, want, rtol=1e-12)
    assert_close(zf, want_zf, rtol=0)
    assert_close(fresh(reverb, jax.random.key(7))[0], y, rtol=0)
    # different keys: different noise (and not the module's own), one room
    # per key under jit and vmap
    keys = jax.random.split(jax.random.key(2), 3)
    ys = jax.jit(jax.vmap(lambda k: reverb(x, key=k)))(keys)
    mine = own(reverb)[0]
    for k in range(3):
        assert_close(ys[k], fresh(reverb, keys[k])[0], rtol=1e-12)
        assert np.max(np.abs(ys[k] - mine)) > 1e-2
    assert np.max(np.abs(ys[0] - ys[1])) > 1e-2


@pytest.mark.slow
def test_reverb_fresh_noise_derivatives():
    reverb = fx.NoiseShapedReverb(key=jax.random.key(1), length=64, n_taps=15)
    x = jnp.asarray(np.random.default_rng(6).standard_normal(16))
    key = jax.random.key(3)
    grad = jax.jit(jax.grad(lambda r: jnp.sum(r(x, key=key) ** 2)))(reverb)
    assert np.isfinite(grad.t60s).all() and np.any(grad.band_gains != 0)
    # no gradient reaches the module's own noise, which this call does not use
    assert np.all(grad.noise == 0)
    jax.test_util.check_grads(
        jax.jit(lambda g: reverb.with_values({"band_gains": g})(x, key=key)),
        (reverb.band_gains,),
        order=1,
        modes=("rev",),
    )
