"""Filter components: the TPT SVF, RBJ sections, and trainable modules."""

import equinox as eqx
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import scipy.signal

import signal_cases
from helpers import (
    assert_close,
    check_float32,
    check_grads,
    check_module_float32,
    naive_allpole,
    np_svf,
)
from retrax.filters import SVF, Biquad, Compressor, ParametricEQ, StateSpaceFilter, svf
from retrax.filters._eq import rbj_section


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


MODES = ["lowpass", "bandpass", "highpass", "notch", "allpass", "peak"]


@pytest.mark.parametrize("mode", MODES)
def test_svf_matches_tpt_equations(mode):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(300)
    y = svf(jnp.asarray(x), 1200.0, 2.0, 16_000.0, mode)
    assert_close(y, np_svf(x, 1200.0, 2.0, 16_000.0, mode)[0])
    # Modulated cutoff and resonance.
    cutoff = 300 + 3000 * (1 + np.sin(np.linspace(0, 6, 300))) / 2
    q = np.linspace(0.5, 8.0, 300)
    y = svf(jnp.asarray(x), jnp.asarray(cutoff), jnp.asarray(q), 16_000.0, mode)
    assert_close(y, np_svf(x, cutoff, q, 16_000.0, mode)[0])


@pytest.mark.parametrize("mode", MODES)
def test_svf_response_is_prewarped_bilinear_transform(mode):
    sr, fc, q = 48_000.0, 3_000.0, 1.7
    n = 8192
    impulse = jnp.zeros(n).at[0].set(1.0)
    h = np.fft.rfft(np.asarray(svf(impulse, fc, q, sr, mode)))
    w = 2 * np.pi * np.fft.rfftfreq(n)
    z = np.exp(1j * w)
    g = np.tan(np.pi * fc / sr)
    s = (z - 1) / (z + 1) / g  # bilinear transform prewarped at the cutoff
    k = 1 / q
    den = s**2 + k * s + 1
    num = {
        "lowpass": 1,
        "bandpass": s,
        "highpass": s**2,
        "notch": s**2 + 1,
        "allpass": s**2 - k * s + 1,
        "peak": 1 - s**2,
    }[mode]
    expected = num / den
    err = np.max(np.abs(h - expected))
    assert err < 1e-9, err


def test_svf_streaming_and_state():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(100)
    y_ref, zf_ref = np_svf(x, 800.0, 0.9, 8_000.0, "bandpass", zi=(0.3, -0.2))
    zi = jnp.asarray([0.3, -0.2])
    y1, z = svf(
        jnp.asarray(x[:40]), 800.0, 0.9, 8_000.0, "bandpass", zi, return_zf=True
    )
    y2, zf = svf(
        jnp.asarray(x[40:]), 800.0, 0.9, 8_000.0, "bandpass", z, return_zf=True
    )
    assert_close(jnp.concatenate([y1, y2]), y_ref)
    assert_close(zf, zf_ref)


@pytest.mark.full
def test_svf_gradients():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal(12))
    check_grads(
        lambda x, c, q: svf(x, c, q, 8_000.0, "lowpass"),
        (x, jnp.asarray(900.0), jnp.asarray(1.3)),
        eps=1e-3,
    )
    cutoff = jnp.linspace(500.0, 1500.0, 12)
    # Per-sample cutoff: first order suffices (the second-order path is the
    # same state_space rule, checked above and in test_state_space.py).
    check_grads(lambda c: svf(x, c, 2.0, 8_000.0, "peak"), (cutoff,), eps=1e-3, order=1)


def test_svf_bad_input():
    x = jnp.ones(16)
    with pytest.raises(eqx.EquinoxRuntimeError, match="cutoff"):
        svf(x, 4_000.0, 1.0, 8_000.0)
    with pytest.raises(eqx.EquinoxRuntimeError, match="cutoff"):
        svf(x, -3.0, 1.0, 8_000.0)
    with pytest.raises(
        eqx.EquinoxRuntimeError, match=r"`q` must be finite and lie in \(0.0, inf\)"
    ):
        svf(x, 1_000.0, 0.0, 8_000.0)
    with pytest.raises((ValueError, TypeError), match="mode"):
        svf(x, 1_000.0, 1.0, 8_000.0, "comb")
    with pytest.raises((ValueError, TypeError), match="cutoff"):
        svf(x, jnp.ones(5) * 100, 1.0, 8_000.0)
    with pytest.raises(ValueError, match="cutoff"):
        SVF(5_000.0, 1.0, 8_000.0)


def test_rbj_sections_match_cookbook_gains():
    sr = 48_000.0
    for shape, f0 in (("peak", 1_000.0), ("lowshelf", 200.0), ("highshelf", 8_000.0)):
        sos = np.asarray(rbj_section(shape, f0, 6.0, 0.7071, sr))[None]
        freqs = np.asarray([1.0, f0, sr / 2 - 1.0])
        _, h = scipy.signal.sosfreqz(sos, worN=freqs, fs=sr)
        db = 20 * np.log10(np.abs(h))
        if shape == "peak":
            assert_close(db[1], 6.0, rtol=1e-9)
            assert abs(db[0]) < 0.01 and abs(db[2]) < 0.01
        elif shape == "lowshelf":
            assert_close(db[0], 6.0, rtol=1e-4)
            assert_close(db[1], 3.0, rtol=1e-6)
        else:
            assert_close(db[2], 6.0, rtol=1e-4)
            assert_close(db[1], 3.0, rtol=1e-6)


def test_parametric_eq_rows_are_the_cookbook_sections_and_its_program_is_flat():
    # every row is `rbj_section` of its shape (low shelf, peaks, high shelf),
    # and the traced gradient does not grow with the number of sections: the
    # sections are computed together and run as one scan, not unrolled
    sr = 44_100.0
    freqs = [60.0, 250.0, 900.0, 3_000.0, 7_000.0, 14_000.0]
    gains = [4.0, -3.0, 2.5, -6.0, 1.5, 5.0]
    qs = [0.7, 1.2, 2.0, 0.9, 3.0, 0.7071]
    eq = ParametricEQ(freqs, gains, qs, sr)
    shapes = ["lowshelf"] + ["peak"] * 4 + ["highshelf"]
    expected = np.stack(
        [
            rbj_section(s, f, g, q, sr)
            for s, f, g, q in zip(shapes, freqs, gains, qs, strict=True)
        ]
    )
    assert_close(np.asarray(eq.sos), expected, rtol=1e-13)

    def size(n):
        eq = ParametricEQ(np.geomspace(50.0, 15_000.0, n), np.ones(n), sample_rate=sr)
        p = eq.to_normalised()
        x = jnp.ones((2, 64))

        def loss(p):
            return jnp.sum(eq.with_normalised(p)(x) ** 2)

        return _equations(jax.make_jaxpr(jax.grad(loss))(p).jaxpr)

    assert size(3) == size(12)


def _equations(jaxpr):
    """The equations of `jaxpr`, those of nested jaxprs (jit, scan, cond) too."""
    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, list | tuple) else (value,):
                if isinstance(sub, jax.extend.core.ClosedJaxpr):
                    total += _equations(sub.jaxpr)
                elif isinstance(sub, jax.extend.core.Jaxpr):
                    total += _equations(sub)
    return total


def _fit(model, x, target, steps, lr):
    """Adam on the module's unconstrained vector, the module built from it
    inside the loss (the documented way to train the filter modules)."""
    opt = optax.adam(lr)
    theta = model.to_unconstrained()
    state = opt.init(theta)

    @eqx.filter_jit
    def step(theta, state):
        def loss(theta):
            return jnp.mean((model.with_unconstrained(theta)(x) - target) ** 2)

        value, grads = jax.value_and_grad(loss)(theta)
        updates, state = opt.update(grads, state)
        return optax.apply_updates(theta, updates), state, value

    losses = []
    # optax's Adam mixes its int32 step count with floats: standard promotion.
    with jax.numpy_dtype_promotion("standard"):
        for _ in range(steps):
            theta, state, value = step(theta, state)
            losses.append(float(value))
    return model.with_unconstrained(theta), losses


@pytest.mark.full
def test_modules_train_with_optax(getkey):
    x = jax.random.normal(getkey(), (512,))
    target = SVF(1_500.0, 2.0, 16_000.0, "lowpass")(x)
    model, losses = _fit(SVF(800.0, 0.9, 16_000.0, "lowpass"), x, target, 150, 0.05)
    assert losses[-1] < 0.05 * losses[0]
    eq_target = ParametricEQ(
        [200.0, 1_000.0, 6_000.0], [3.0, -6.0, 4.0], None, 16_000.0
    )(x)
    eq, losses = _fit(
        ParametricEQ([200.0, 1_000.0, 6_000.0], sample_rate=16_000.0),
        x,
        eq_target,
        100,
        0.1,
    )
    assert losses[-1] < 0.05 * losses[0]
    bq = Biquad(jnp.asarray([1.0, 0.0, 0.0]), 0.5, 1.0)
    bq_target = Biquad(jnp.asarray([0.5, 0.2, 0.1]), 0.9, 0.6)(x)
    bq, losses = _fit(bq, x, bq_target, 200, 0.03)
    assert losses[-1] < 0.1 * losses[0]
    assert float(bq.radius) < 0.999


@pytest.mark.slow
def test_compressor_and_state_space_modules(getkey):
    x = jax.random.normal(getkey(), (256,)) * jnp.linspace(0.01, 1.0, 256)
    comp = Compressor(threshold_db=-20.0, ratio=4.0, sample_rate=8_000.0)
    y = comp(x)
    assert y.shape == x.shape and bool(jnp.all(jnp.abs(y) <= jnp.abs(x) + 1e-12))
    grads = eqx.filter_grad(lambda m: jnp.sum(m(x) ** 2))(comp)
    leaves = jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in leaves)
    # Silence: finite gradients.
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.zeros(64))))(comp)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(grads))
    ssf = StateSpaceFilter(4, getkey())
    y = ssf(x)
    assert y.dtype == x.dtype
    # Each conjugate pair is the real second-order section
    # 2 Re(c b z^-1 / (1 - p z^-1)), plus the direct term d x.
    ref = float(ssf.d) * np.asarray(x)
    for p, b, c in zip(np.asarray(ssf.poles), ssf.b, ssf.c, strict=True):
        cb = complex(c[0], c[1]) * complex(b[0], b[1])
        num = [0.0, 2 * cb.real, -2 * (cb * np.conj(p)).real]
        den = [1.0, -2 * p.real, abs(p) ** 2]
        ref = ref + scipy.signal.lfilter(num, den, np.asarray(x))
    assert_close(y, ref, rtol=1e-12)
    assert bool(jnp.all(jnp.abs(ssf.poles) < 1))

    # Its parameter gradients equal those of the same sections written as a
    # plain scan and a convolution, differentiated by JAX.
    def sections(m, x):
        p = m.poles
        cb = jax.lax.complex(m.c[:, 0], m.c[:, 1]) * jax.lax.complex(
            m.b[:, 0], m.b[:, 1]
        )
        out = m.d * x
        for j in range(p.shape[0]):
            den = jnp.stack([-2 * jnp.real(p[j]), jnp.abs(p[j]) ** 2])
            num = jnp.stack(
                [2 * jnp.real(cb[j]), -2 * jnp.real(cb[j] * jnp.conj(p[j]))]
            )
            w = jnp.convolve(naive_allpole(x, den), num)[: x.shape[0] - 1]
            out = out + jnp.concatenate([jnp.zeros(1, w.dtype), w])  # the z^-1
        return out

    grads = eqx.filter_grad(lambda m: jnp.sum(jnp.sin(m(x))))(ssf)
    ref = eqx.filter_jit(eqx.filter_grad(lambda m: jnp.sum(jnp.sin(sections(m, x)))))(
        ssf
    )
    for g, r in zip(jax.tree.leaves(grads), jax.tree.leaves(ref), strict=True):
        assert_close(g, r, rtol=1e-10)
    y32 = jax.jit(jax.vmap(ssf))(jnp.ones((2, 32), jnp.float32))
    assert y32.dtype == jnp.float32


def test_module_parameters_are_not_weakly_typed(getkey):
    # A weakly typed leaf turns strong after one optimizer update, so a jitted
    # training step would compile twice (ParametricEQ's default `qs` did).
    modules = [
        SVF(1_000.0),
        ParametricEQ([100.0, 1_000.0, 5_000.0]),
        Biquad(jnp.asarray([1.0, 0.0, 0.0])),
        Compressor(),
        StateSpaceFilter(2, getkey()),
    ]
    for module in modules:
        for path, leaf in jax.tree_util.tree_leaves_with_path(module):
            assert not leaf.weak_type, (type(module).__name__, path)


T = 64


@pytest.mark.float32
@pytest.mark.parametrize("mode", ["lowpass", "peak"])
def test_svf(mode):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(T)
    cutoff = 300 + 3000 * (1 + np.sin(np.linspace(0, 6, T))) / 2

    def f(x, cutoff, q):
        return svf(x, cutoff, q, 16_000.0, mode)

    ref = np_svf(x, cutoff, 2.0, 16_000.0, mode)[0]
    check_float32(f, (x, cutoff, 2.0), ref)


@pytest.mark.float32
def test_svf_module():
    x = np.random.default_rng(8).standard_normal(T)
    y = check_module_float32(lambda: SVF(1_200.0, 2.0, 16_000.0, "bandpass"), x)
    assert_close(y, np_svf(x, 1_200.0, 2.0, 16_000.0, "bandpass")[0], rtol=1e-10)


@pytest.mark.float32
def test_biquad_module():
    x = np.random.default_rng(9).standard_normal(T)
    check_module_float32(lambda: Biquad(np.asarray([0.5, 0.2, 0.1]), 0.9, 0.6), x)


@pytest.mark.float32
def test_parametric_eq_module():
    x = np.random.default_rng(10).standard_normal(T)
    check_module_float32(
        lambda: ParametricEQ(
            [200.0, 1_000.0, 6_000.0], [3.0, -6.0, 4.0], None, 16_000.0
        ),
        x,
    )


@pytest.mark.float32
def test_svf_module_from_unconstrained():
    # the documented training path (fit_svf.py's): the module built from its
    # unconstrained vector, and the gradient with respect to that vector (the
    # other modules' maps are the same sigmoid and softplus)
    def make():
        return SVF(1_200.0, 2.0, 16_000.0, "bandpass")

    x = np.random.default_rng(12).standard_normal(T)
    theta = np.asarray(make().to_unconstrained())
    check_float32(lambda theta, x: make().with_unconstrained(theta)(x), (theta, x))


@pytest.mark.float32
def test_compressor_module():
    rng = np.random.default_rng(11)
    x = rng.standard_normal(256) * np.linspace(0.01, 1.0, 256)
    # The expander acts too (on the quiet start), so every parameter matters;
    # the levels pass through the soft knee, and the gain leads by 4 samples.
    check_module_float32(
        lambda: Compressor(
            threshold_db=-20.0,
            ratio=4.0,
            exp_threshold_db=-30.0,
            sample_rate=8_000.0,
            knee_db=10.0,
            lookahead_samples=4,
        ),
        x,
    )


class TestInputPolicy(signal_cases.InputPolicy):
    """The input policy shared by the signal-processing areas
    (signal_cases.py), over this area's functions."""

    area = "filters"
