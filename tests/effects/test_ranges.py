"""Every ranged effect's documented ranges, as a controller uses them.

Property tests over the ranges: any physical values drawn from an effect's
ranges (set on its fields, as a user or `eqx.tree_at` sets them; a vector
field entry by entry, so the equaliser's frequencies come in any order) give
a normalised vector in [0, 1] that maps back to the same values. And the
compressor's unconstrained vector: an optimiser's step on it, however large,
gives a valid compressor.
"""

import inspect
import re

import equinox as eqx
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from helpers import assert_close, unchecked
from retrax import effects as fx, filters


SR = 8_000.0


# One instance of each ranged effect, with its structure (sample rate, delay
# lengths, sections); the property tests draw its parameters' values.
EFFECTS = {
    "Biquad": lambda: fx.Biquad(jnp.asarray([0.5, 0.2, -0.1]), 0.7, 0.9),
    "Chorus": lambda: fx.Chorus(sample_rate=SR),
    "Compressor": lambda: fx.Compressor(sample_rate=SR, lookahead_samples=2),
    "DaspCompressor": lambda: fx.DaspCompressor(sample_rate=SR),
    "DaspParametricEQ": lambda: fx.DaspParametricEQ(sample_rate=44_100),
    "DaspStereoPanner": fx.DaspStereoPanner,
    "DaspStereoWidener": fx.DaspStereoWidener,
    "Delay": lambda: fx.Delay(sample_rate=SR),
    "Distortion": fx.Distortion,
    "FDNReverb": lambda: fx.FDNReverb(delays=(3, 5, 7, 11), sample_rate=SR),
    "FeedbackDelay": lambda: fx.FeedbackDelay(delay_samples=4),
    "Freeverb": lambda: fx.Freeverb(sample_rate=441),
    "Gain": fx.Gain,
    "NoiseShapedReverb": lambda: fx.NoiseShapedReverb(
        key=jax.random.key(0), length=64, n_taps=15
    ),
    # six sections, as dasp-pytorch's parametric_eq
    "ParametricEQ": lambda: fx.ParametricEQ(
        [100.0, 400.0, 1_500.0, 5_000.0, 13_000.0, 15_000.0], sample_rate=44_100
    ),
    "ParametricEQ(ordered)": lambda: fx.ParametricEQ(
        [100.0, 400.0, 1_500.0, 5_000.0], sample_rate=44_100, ordered=True
    ),
    "PingPongDelay": lambda: fx.PingPongDelay(delay_samples=3),
    "StereoPanner": fx.StereoPanner,
    "StereoWidener": fx.StereoWidener,
    "SVF": lambda: fx.SVF(300.0, 1.3, SR, "bandpass"),
}


def _ranged_classes():
    """The concrete ranged effects that `retrax.effects` and `retrax.filters`
    export."""
    names = set()
    for package in (fx, filters):
        for name, value in vars(package).items():
            if (
                inspect.isclass(value)
                and issubclass(value, fx.AbstractRangedEffect)
                and not inspect.isabstract(value)
            ):
                names.add(name)
    return names


def test_every_ranged_effect_is_covered():
    covered = {name.split("(")[0] for name in EFFECTS}
    assert covered == _ranged_classes()


_ENTRY = re.compile(r"(?P<field>\w+)\[(?P<index>\d+)\]")


@st.composite
def _values(draw, effect):
    """Physical values drawn from each range of `effect.ranges()`, ends
    included, by field name: one value per entry of a vector field."""
    values = {}
    for key, r in effect.ranges().items():
        match = _ENTRY.fullmatch(key)
        field = key if match is None else match["field"]
        shape = np.shape(getattr(effect, field))
        entries = values.setdefault(field, np.zeros(shape))
        # an entry's range is its own band (`ordered=True`): the bands touch,
        # and the sections must increase strictly, so a band's top is left out
        floats = st.floats(r.low, r.high, exclude_max=match is not None)
        draws = [draw(floats) for _ in range(1 if match else int(np.prod(shape)))]
        if match is None:
            entries[...] = np.reshape(draws, shape)
        else:
            entries[int(match["index"])] = draws[0]
    return values


def _with(effect, values):
    """`effect` with the fields of `values` set by `eqx.tree_at`."""
    names = list(values)
    return eqx.tree_at(
        lambda m: [getattr(m, n) for n in names],
        effect,
        [jnp.asarray(values[n]) for n in names],
    )


@pytest.mark.parametrize("name", list(EFFECTS))
def test_normalised_parameters_of_any_valid_effect_lie_in_unit_interval(name):
    effect = EFFECTS[name]()
    normalise = eqx.filter_jit(lambda e: e.to_normalised())
    rebuild = eqx.filter_jit(lambda e, p: e.with_normalised(p))

    @hypothesis.settings(deadline=None, max_examples=25, derandomize=True)
    @hypothesis.given(_values(effect))
    def check(values):
        moved = _with(effect, values)
        p = normalise(moved)
        assert p.shape == (effect.n_params,)
        assert bool(jnp.all((p >= 0) & (p <= 1))), (values, p)
        back = rebuild(moved, p)
        for field, value in values.items():
            assert_close(getattr(back, field), value, rtol=1e-9, atol=1e-12)
        # and the rebuilt effect normalises again (its values in their ranges)
        assert_close(normalise(back), p, rtol=1e-9, atol=1e-12)

    check()


def test_parametric_eq_normalises_dasp_presets_in_any_order():
    # the cases: six sections up to 15 kHz, and a high shelf below
    # the last peak (dasp-pytorch accepts both)
    for freqs in (
        [100.0, 400.0, 1_500.0, 5_000.0, 13_000.0, 15_000.0],
        [100.0, 400.0, 1_500.0, 5_000.0, 13_000.0, 8_000.0],
        [18_000.0, 9_000.0, 3_000.0, 700.0, 120.0, 20.0],
    ):
        eq = fx.ParametricEQ(freqs, np.linspace(-18, 18, 6), np.geomspace(0.1, 10, 6))
        p = eq.to_normalised()
        assert bool(jnp.all((p >= 0) & (p <= 1)))
        assert_close(eq.with_normalised(p).freqs, freqs, rtol=1e-12)


# --- the compressor's unconstrained vector -------------------------------------


def _compressor():
    return fx.Compressor(
        -20.0,
        3.0,
        2.0,
        50.0,
        2.0,
        exp_threshold_db=-60.0,
        exp_ratio=0.6,
        sample_rate=SR,
        knee_db=6.0,
        lookahead_samples=2,
    )


PHYSICAL = (
    "threshold_db",
    "ratio",
    "attack_ms",
    "release_ms",
    "makeup_db",
    "knee_db",
    "exp_threshold_db",
    "exp_ratio",
    "rms_ms",
)


def _fields(c):
    return {name: getattr(c, name) for name in PHYSICAL}


def test_compressor_unconstrained_round_trip():
    c = _compressor()
    theta = c.to_unconstrained()
    assert theta.shape == (9,)
    back = c.with_unconstrained(theta)
    for name, value in _fields(c).items():
        assert_close(getattr(back, name), value, rtol=1e-13)
    assert back.sample_rate == c.sample_rate
    assert back.lookahead_samples == c.lookahead_samples
    # the documented map, entry by entry
    softplus = jax.nn.softplus
    assert_close(back.threshold_db, theta[0], rtol=0)
    assert_close(back.ratio, 1 + softplus(theta[1]), rtol=1e-15)
    assert_close(back.exp_ratio, jax.nn.sigmoid(theta[7]), rtol=1e-15)
    assert_close(back.rms_ms, softplus(theta[8]), rtol=1e-15)
    # a hard knee maps to the clipping at -15 and back to a tiny soft knee
    hard = fx.Compressor(sample_rate=SR)
    theta = hard.to_unconstrained()
    assert bool(jnp.all(jnp.isfinite(theta)))
    assert_close(theta[5], -15.0, rtol=1e-12)
    assert 0 < float(hard.with_unconstrained(theta).knee_db) < 1e-6


def test_compressor_any_unconstrained_vector_is_valid():
    c = _compressor()
    x = jnp.asarray(np.random.default_rng(1).standard_normal(256))
    run = eqx.filter_jit(lambda c, x: c(x))
    rng = np.random.default_rng(2)
    for scale in (1.0, 10.0, 1e3, 1e6):
        theta = c.to_unconstrained() + scale * rng.standard_normal(9)
        moved = c.with_unconstrained(jnp.asarray(theta))
        assert float(moved.ratio) > 1
        assert 0 < float(moved.exp_ratio) < 1
        for name in ("attack_ms", "release_ms", "rms_ms"):
            assert float(getattr(moved, name)) > 0
        assert float(moved.knee_db) >= 0
        # the call checks every field, and runs; its output is finite unless
        # the makeup gain itself overflows (a valid 1e6 dB, say)
        y = run(moved, x)
        if scale <= 10:
            assert bool(jnp.all(jnp.isfinite(y)))
    with pytest.raises(ValueError, match=r"`theta` must be the 9"):
        unchecked(type(c).with_unconstrained)(c, jnp.zeros(8))
    with pytest.raises(Exception, match=r"`theta` \(unconstrained parameters\)"):
        c.with_unconstrained(jnp.full(9, jnp.nan))


@pytest.mark.parametrize("lr", [1.0, 100.0])
@pytest.mark.full
def test_compressor_adam_step_on_unconstrained_vector_stays_valid(lr):
    # the case: one Adam step of lr 1 on the physical fields took the
    # ratio to 0.2 and the next call raised; on the unconstrained vector every
    # step is a valid compressor, and the loss can be evaluated again
    x = jnp.asarray(np.sin(0.05 * np.arange(2_000)) * np.linspace(0.05, 1, 2_000))
    target = fx.Compressor(-30.0, 8.0, 1.0, 20.0, 4.0, sample_rate=SR)(x)
    model = _compressor()

    @jax.jit
    def loss(theta):
        return jnp.mean((model.with_unconstrained(theta)(x) - target) ** 2)

    theta = model.to_unconstrained()
    optimizer = optax.adam(lr)
    state = optimizer.init(theta)
    for _ in range(3):
        grads = jax.grad(loss)(theta)
        assert bool(jnp.all(jnp.isfinite(grads)))
        # optax's Adam mixes its int32 step count with floats
        with jax.numpy_dtype_promotion("standard"):
            updates, state = optimizer.update(grads, state)
            theta = optax.apply_updates(theta, updates)
        # every entry moved by about lr: far, in the physical units
        stepped = model.with_unconstrained(theta)
        assert float(stepped.ratio) > 1
        assert bool(jnp.isfinite(loss(theta)))
    # for contrast, the ratio of 0.2 set on the physical field raises
    bad = eqx.tree_at(lambda c: c.ratio, model, jnp.asarray(0.2))
    with pytest.raises(Exception, match="`ratio`"):
        bad(x)


def test_range_ends_map_into_the_unit_interval():
    # rounding at a range's ends is clamped away: a band edge of an ordered
    # equaliser (a geomspace value) once normalised to -6e-17 under jit
    edges = np.geomspace(44_100 / 2205, 0.45 * 44_100, 5)
    for r in (
        fx.Range(float(edges[1]), float(edges[2]), log=True),
        fx.Range(0.1, 100.0, log=True),
        fx.Range(-0.3, 0.7),
    ):
        ends = jnp.asarray([r.low, r.high])
        u = jax.jit(r.normalised)(ends)
        assert bool(jnp.all((u >= 0) & (u <= 1)))
        assert_close(u, [0.0, 1.0], rtol=0, atol=1e-15)
        v = jax.jit(r.physical)(jnp.asarray([0.0, 1.0]))
        assert bool(jnp.all((v >= r.low) & (v <= r.high)))
        assert_close(v, ends, rtol=1e-15)
        # inside, the maps are unchanged and have derivative 1 through the clamp
        u = jnp.asarray(0.3)
        assert_close(r.normalised(r.physical(u)), u, rtol=1e-14)
        assert_close(jax.grad(lambda u, r=r: r.normalised(r.physical(u)))(u), 1.0)


@pytest.mark.float32
@pytest.mark.parametrize("name", list(EFFECTS))
def test_normalised_round_trip_in_float32(name):
    # in float32 (the users' default precision) too, a controller's output at
    # the ends of [0, 1], or anywhere inside, builds an effect whose values
    # lie in their ranges: it normalises again into [0, 1]
    effect = EFFECTS[name]()
    rng = np.random.default_rng(5)
    batch = np.concatenate(
        [
            np.zeros((1, effect.n_params)),
            np.ones((1, effect.n_params)),
            rng.uniform(size=(8, effect.n_params)),
        ]
    )
    batch = jnp.asarray(batch, jnp.float32)
    round_trip = eqx.filter_jit(
        eqx.filter_vmap(lambda p: effect.with_normalised(p).to_normalised())
    )
    p = round_trip(batch)
    assert p.dtype == jnp.float32
    assert bool(jnp.all((p >= 0) & (p <= 1)))
    assert_close(p, batch, rtol=0, atol=1e-5)


# --- every effect's unconstrained vector -----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", list(EFFECTS))
def test_adam_steps_on_any_effects_unconstrained_vector_stay_valid(name):
    # Adam with learning rates 1 and 100 (every entry moves by about lr a
    # step: far past the clipping, in either direction) on the unconstrained
    # vector: each step is an effect whose parameters lie in their ranges
    # and whose output and gradient are finite. The filters map the vector
    # onto their whole valid regions (a cutoff anywhere below Nyquist, any
    # numerator), wider than their ranges: each step is a valid filter (its
    # own checks pass), not necessarily one inside its normalised ranges.
    effect = EFFECTS[name]()
    own_map = type(effect).with_unconstrained is not (
        fx.AbstractRangedEffect.with_unconstrained
    )
    rng = np.random.default_rng(7)
    x = jnp.asarray(0.5 * rng.standard_normal(64))

    def output(theta):
        return effect.with_unconstrained(theta)(x)

    target = output(effect.to_unconstrained()) + 0.1

    @jax.jit
    def loss_and_grad(theta):
        return jax.value_and_grad(lambda t: jnp.mean((output(t) - target) ** 2))(theta)

    if own_map:
        # the filter's own checks of its valid region, as its call makes them
        def normalise(theta):
            moved = effect.with_unconstrained(theta)
            values = jax.tree.leaves(moved.checked_values())
            return jnp.zeros(effect.n_params) + 0 * sum(jnp.sum(v) for v in values)

        normalise = jax.jit(normalise)
    else:
        normalise = jax.jit(
            lambda theta: effect.with_unconstrained(theta).to_normalised()
        )
    for lr in (1.0, 100.0):
        theta = effect.to_unconstrained()
        # the filters' own maps may have more entries (the compressor's nine
        # fields, six of them ranged)
        assert theta.shape == (effect.n_params,) or own_map
        optimizer = optax.adam(lr)
        state = optimizer.init(theta)
        for _ in range(3):
            value, grads = loss_and_grad(theta)
            assert bool(jnp.isfinite(value)) and bool(jnp.all(jnp.isfinite(grads)))
            # optax's Adam mixes its int32 step count with floats
            with jax.numpy_dtype_promotion("standard"):
                updates, state = optimizer.update(grads, state)
                theta = optax.apply_updates(theta, updates)
            p = normalise(theta)
            assert bool(jnp.all((p >= 0) & (p <= 1))), (lr, theta, p)
        assert bool(jnp.all(jnp.isfinite(output(theta))))
    # far beyond any step, both signs: still valid
    for sign in (1.0, -1.0):
        p = normalise(jnp.full(theta.shape, sign * 1e30))
        assert bool(jnp.all((p >= 0) & (p <= 1)))


@pytest.mark.parametrize("name", ["Gain", "Delay", "StereoWidener", "FDNReverb"])
def test_unconstrained_vector_is_the_logit_of_the_normalised_one(name):
    effect = EFFECTS[name]()
    rng = np.random.default_rng(8)
    u = jnp.asarray(rng.uniform(0.05, 0.95, effect.n_params))
    moved = effect.with_normalised(u)
    theta = moved.to_unconstrained()
    assert_close(theta, np.log(u) - np.log1p(-u), rtol=1e-9)
    assert_close(effect.with_unconstrained(theta).to_normalised(), u, rtol=1e-9)
    with pytest.raises(ValueError, match=f"`theta` must be the {effect.n_params}"):
        unchecked(type(effect).with_unconstrained)(
            effect, jnp.zeros(effect.n_params + 1)
        )
    with pytest.raises(Exception, match=r"`theta` \(unconstrained parameters\)"):
        effect.with_unconstrained(jnp.full(effect.n_params, jnp.nan))
