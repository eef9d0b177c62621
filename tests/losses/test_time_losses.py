"""The time-domain losses against auraloss 0.4.0 (directly when installed,
else stored values), their gradients, transformations and bad input."""

import importlib.util
import json
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.losses as rl


DATA = pathlib.Path(__file__).parents[1] / "data"
_spec = importlib.util.spec_from_file_location(
    "time_loss_reference", DATA / "time_loss_reference.py"
)
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)
CASES = reference.signals()
NAMES = [name for name, _, _ in reference.LOSSES]
SETTINGS = {name: (cls, kwargs) for name, cls, kwargs in reference.LOSSES}


@pytest.fixture(scope="module")
def expected():
    """auraloss's values: computed now if auraloss is installed, otherwise
    the stored ones, after checking they belong to these inputs."""
    if importlib.util.find_spec("auraloss") is not None:
        return reference.auraloss_values(CASES)
    stored = json.loads((DATA / "time_loss_reference.json").read_text())
    for case, (pred, target) in CASES.items():
        prints = stored["fingerprints"][case]
        np.testing.assert_allclose(reference.fingerprint(pred), prints["pred"])
        np.testing.assert_allclose(reference.fingerprint(target), prints["target"])
    return stored["values"]


def _loss(name):
    cls, kwargs = SETTINGS[name]
    return getattr(rl, cls)(**kwargs)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", NAMES)
def test_equals_auraloss_float64(expected, name, case):
    pred, target = CASES[case]
    out = jax.jit(_loss(name))(jnp.asarray(pred), jnp.asarray(target))
    assert out.dtype == jnp.float64
    np.testing.assert_allclose(
        np.ravel(out), expected["float64"][name][case], rtol=1e-12, atol=1e-14
    )


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", NAMES)
def test_gradient_equals_auraloss_float64(expected, name, case):
    pred, target = CASES[case]
    loss = _loss(name)
    grad = jax.jit(jax.grad(lambda p: jnp.sum(loss(p, jnp.asarray(target)))))(
        jnp.asarray(pred)
    )
    want = np.asarray(expected["grad"][name][case])
    # the sum of a zero-mean loss's gradient is 0 up to rounding: relative to
    # the gradient's scale (the fingerprint's largest entry)
    np.testing.assert_allclose(
        reference.fingerprint(grad), want, rtol=1e-10, atol=1e-10 * np.abs(want).max()
    )


@pytest.mark.float32
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("name", NAMES)
def test_equals_auraloss_float32(expected, name, case):
    pred, target = CASES[case]
    p32, t32 = pred.astype(np.float32), target.astype(np.float32)
    out = _loss(name)(p32, t32)
    assert out.dtype == jnp.float32
    want = np.asarray(expected["float32"][name][case])
    np.testing.assert_allclose(np.ravel(out), want, rtol=1e-5, atol=1e-6)


@pytest.mark.full
def test_reduction_none_is_per_signal_and_vmap_agrees():
    pred, target = (jnp.asarray(v) for v in CASES["batch"])
    for cls in (rl.ESRLoss, rl.DCLoss, rl.LogCoshLoss, rl.SNRLoss, rl.SISDRLoss):
        per = cls(reduction="none")(pred, target)
        assert per.shape == pred.shape[:-1]
        mapped = jax.vmap(jax.vmap(cls(reduction="none")))(pred, target)
        np.testing.assert_allclose(per, mapped, rtol=1e-12)
        np.testing.assert_allclose(cls()(pred, target), jnp.mean(per), rtol=1e-12)
        np.testing.assert_allclose(
            cls(reduction="sum")(pred, target), jnp.sum(per), rtol=1e-12
        )


def test_perfect_prediction_and_scale_invariance():
    _, target = (jnp.asarray(v) for v in CASES["stereo"])
    assert rl.ESRLoss()(target, target) == 0
    assert rl.DCLoss()(target, target) == 0
    # SI-SDR ignores the prediction's gain; SNR and SD-SDR do not
    np.testing.assert_allclose(
        rl.SISDRLoss()(3 * target + 0.3 * jnp.sin(target), target),
        rl.SISDRLoss()(target + 0.1 * jnp.sin(target), target),
        rtol=1e-6,
    )
    assert rl.SNRLoss()(3 * target, target) > rl.SNRLoss()(target * 1.01, target)
    # the gradient at a perfect prediction is zero (no NaN)
    for loss in (rl.ESRLoss(), rl.DCLoss(), rl.LogCoshLoss()):
        g = jax.grad(lambda p, loss=loss: loss(p, target))(target)
        assert jnp.all(g == 0)


def test_log_cosh_is_finite_where_cosh_overflows():
    x = jnp.array([100.0, -200.0, 0.0], jnp.float32)
    out = rl.LogCoshLoss(reduction="none")(x, jnp.zeros(3, jnp.float32))
    want = (100 + 200 + 0) / 3 - 2 * np.log(2) / 3
    np.testing.assert_allclose(out, want, rtol=1e-5)


def test_bad_settings_and_signals_raise_naming_the_argument():
    # the test suite's type checker rejects a string outside the `Literal`
    # first (a TypeError naming the argument too)
    with pytest.raises((ValueError, TypeError), match="reduction"):
        rl.ESRLoss(reduction="avg")
    with pytest.raises(ValueError, match="`eps`"):
        rl.SNRLoss(eps=-1.0)
    with pytest.raises(ValueError, match="`a`"):
        rl.LogCoshLoss(a=0.0)
    with pytest.raises(TypeError, match="zero_mean"):
        rl.SISDRLoss(zero_mean=1)
    with pytest.raises(ValueError, match="same shape"):
        rl.ESRLoss()(jnp.ones(8), jnp.ones(9))
    with pytest.raises(ValueError, match="non-finite"):
        rl.DCLoss()(jnp.array([1.0, jnp.nan]), jnp.ones(2))
    with pytest.raises(eqx.EquinoxRuntimeError, match="non-finite"):
        eqx.filter_jit(rl.DCLoss())(jnp.array([1.0, jnp.nan]), jnp.ones(2))


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("zero_mean", [True, False])
def test_non_finite_signal_raises_naming_it_for_every_loss(bad, zero_mean):
    # the check reads the inputs only when the loss is not finite: every loss
    # must be non-finite where an input is (the SNR without zero mean and an
    # infinite prediction once gave the finite -10 log10(eps))
    rng = np.random.default_rng(3)
    good = jnp.asarray(rng.standard_normal((2, 3, 32)))
    broken = good.at[1, 2, 5].set(bad)
    losses = [rl.ESRLoss(), rl.DCLoss(), rl.LogCoshLoss()]
    losses += [
        cls(zero_mean=zero_mean) for cls in (rl.SNRLoss, rl.SISDRLoss, rl.SDSDRLoss)
    ]
    for loss in losses:
        for name, args in (("pred", (broken, good)), ("target", (good, broken))):
            with pytest.raises(ValueError, match=f"`{name}` contains non-finite"):
                loss(*args)
            with pytest.raises(eqx.EquinoxRuntimeError, match=f"`{name}`"):
                eqx.filter_jit(loss)(*args)
        # finite input: no error, a finite value
        assert bool(jnp.isfinite(loss(good, 0.5 * good + 0.1)))
