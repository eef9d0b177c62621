"""Quiet failures of the losses, each one loud or finite now: finite signals
whose squares overflow float32, `eps=0` on a silent target, a traced
`LogCoshLoss(a <= 0)`, and the STFT phase term's derivative at silence."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.losses as rl
from helpers import assert_close


def _signals(shape=(2, 2048), seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape), rng.standard_normal(shape)


RATIOS = [rl.ESRLoss, rl.DCLoss, rl.SNRLoss, rl.SISDRLoss, rl.SDSDRLoss]
RATIO_IDS = [c.__name__ for c in RATIOS]


@pytest.mark.parametrize("cls", RATIOS, ids=RATIO_IDS)
def test_time_domain_ratio_of_loud_signals_is_finite(cls):
    # Before: signals at 1e20 (float32: their squares overflow) gave inf or
    # NaN. A ratio of energies is unchanged by a common scale, so it equals
    # the ratio of the signals at unit scale (computed in float64 here).
    pred, target = _signals()
    loss = cls()
    want = loss(jnp.asarray(pred), jnp.asarray(target))
    loud = (
        jnp.asarray(pred * 1e20, jnp.float32),
        jnp.asarray(target * 1e20, jnp.float32),
    )
    for f in (loss, jax.jit(loss)):
        got = f(*loud)
        assert bool(jnp.isfinite(got))
        assert_close(got, want, rtol=1e-5)
    grad = jax.grad(lambda p: loss(p, loud[1]))(loud[0])
    assert bool(jnp.all(jnp.isfinite(grad)))


@pytest.mark.parametrize("cls", RATIOS, ids=RATIO_IDS)
def test_time_domain_ratio_overflow_agrees_in_float64(cls):
    # the same in float64, whose squares overflow near 1e154: the value, and
    # the derivative (scaled back) of the loud signals are those at unit scale
    pred, target = _signals((3, 512), seed=1)
    # (an eps negligible at both scales: at 1e160 the scaled eps underflows)
    loss = cls(eps=1e-30)
    scale = 1e160
    want = loss(jnp.asarray(pred), jnp.asarray(target))
    got = loss(jnp.asarray(pred * scale), jnp.asarray(target * scale))
    assert_close(got, want, rtol=1e-12)
    want_grad = jax.grad(lambda p: loss(p, jnp.asarray(target)))(jnp.asarray(pred))
    grad = jax.grad(lambda p: loss(p, jnp.asarray(target * scale)))(
        jnp.asarray(pred * scale)
    )
    assert_close(grad * scale, want_grad, rtol=1e-10)


@pytest.mark.parametrize("cls", RATIOS, ids=RATIO_IDS)
def test_time_domain_ratio_gradients_of_loud_signals_in_float32(cls):
    # Each derivative is rescued on its own (the direct one wherever it is
    # finite): with respect to `pred` and to `target` of signals at 1e20 in
    # float32, both are those at unit scale in float64, scaled back.
    pred, target = _signals((2, 256), seed=3)
    loss = cls()
    want = jax.grad(lambda p, t: loss(p, t), argnums=(0, 1))(
        jnp.asarray(pred), jnp.asarray(target)
    )
    loud = [jnp.asarray(v * 1e20, jnp.float32) for v in (pred, target)]
    for f in (loss, jax.jit(loss)):
        got = jax.grad(lambda p, t, f=f: f(p, t), argnums=(0, 1))(*loud)
        for g, w in zip(got, want, strict=True):
            assert_close(g * 1e20, w, rtol=1e-4)


@pytest.mark.full
def test_time_domain_rescue_leaves_other_signals_of_a_batch_unchanged():
    # one loud signal in a batch: the others' values are the same as alone
    pred, target = _signals((3, 256), seed=2)
    loud_pred, loud_target = pred.copy(), target.copy()
    loud_pred[1] *= 1e200
    loud_target[1] *= 1e200
    for cls in RATIOS:
        # (an eps negligible at both scales, as in the test above)
        loss = cls(eps=1e-30, reduction="none")
        quiet = loss(jnp.asarray(pred), jnp.asarray(target))
        got = loss(jnp.asarray(loud_pred), jnp.asarray(loud_target))
        assert_close(got, quiet, rtol=1e-12)
        vmapped = jax.vmap(loss)(jnp.asarray(loud_pred), jnp.asarray(loud_target))
        assert_close(vmapped, quiet, rtol=1e-12)


OVERFLOW = r"The loss of these finite signals is not finite in float32"


@pytest.mark.loud
@pytest.mark.parametrize("cls", [rl.ESRLoss, rl.DCLoss], ids=["ESR", "DC"])
def test_time_domain_value_beyond_the_dtype_raises(cls):
    # ESR and DC of a prediction about 1e20 times louder than its target (and
    # its mean as large) are about 1e40: beyond float32, an error, not inf
    pred, target = _signals()
    loud = (pred + 1) * 1e20
    args = (jnp.asarray(loud, jnp.float32), jnp.asarray(target, jnp.float32))
    with pytest.raises(ValueError, match=OVERFLOW):
        cls()(*args)
    with pytest.raises(eqx.EquinoxRuntimeError, match=OVERFLOW):
        eqx.filter_jit(cls())(*args)


@pytest.mark.parametrize(
    "cls", [rl.SNRLoss, rl.SISDRLoss, rl.SDSDRLoss], ids=["SNR", "SISDR", "SDSDR"]
)
def test_signal_to_error_of_a_loud_prediction_is_finite(cls):
    # Before: NaN. A prediction 1e20 times louder than its target in float32
    # (the ratios themselves are moderate): the float64 values of the same
    # signals, which float64 computes directly.
    pred, target = _signals()
    loss = cls()
    want = loss(jnp.asarray(pred * 1e20), jnp.asarray(target))
    args = (jnp.asarray(pred * 1e20, jnp.float32), jnp.asarray(target, jnp.float32))
    assert_close(loss(*args), want, rtol=1e-5)
    grad = jax.grad(lambda p: loss(p, args[1]))(args[0])
    want_grad = jax.grad(lambda p: loss(p, jnp.asarray(target)))(
        jnp.asarray(pred * 1e20)
    )
    # (SNR's derivative here is about 1e-54: below float32's range, 0 there)
    assert_close(grad, want_grad, rtol=1e-4, atol=float(np.finfo(np.float32).tiny))


EPS_ZERO = r"The loss divides by zero: `eps` is 0 and `target` is silent"


@pytest.mark.loud
@pytest.mark.parametrize("cls", RATIOS, ids=RATIO_IDS)
def test_eps_zero_on_a_silent_target_raises(cls):
    # Before: inf (ESR, DC, SNR) or NaN (SI-SDR, SD-SDR).
    pred, _ = _signals()
    args = (jnp.asarray(pred), jnp.zeros(pred.shape))
    with pytest.raises(ValueError, match=EPS_ZERO):
        cls(eps=0.0)(*args)
    with pytest.raises(eqx.EquinoxRuntimeError, match=EPS_ZERO):
        eqx.filter_jit(cls(eps=0.0))(*args)
    # a traced eps of 0
    with pytest.raises(Exception, match=EPS_ZERO):
        jax.jit(lambda e: cls(eps=e)(*args))(jnp.asarray(0.0))
    # eps > 0 on the same silent target: finite
    assert bool(jnp.isfinite(cls()(*args)))


@pytest.mark.loud
@pytest.mark.parametrize("a", [0.0, -1.0, np.nan, np.inf])
def test_log_cosh_traced_a_must_be_positive(a):
    # Before: a traced a = 0 gave inf (a Python 0 raised at construction).
    pred, target = (jnp.asarray(v) for v in _signals((64,)))
    match = r"`a` must be a finite number > 0"
    with pytest.raises(Exception, match=match):
        jax.jit(lambda a: rl.LogCoshLoss(a=a)(pred, target))(jnp.asarray(a))
    with pytest.raises(Exception, match=match):
        jax.grad(lambda a: rl.LogCoshLoss(a=a)(pred, target))(jnp.asarray(a))
    # a valid traced a: the value of the Python one
    got = jax.jit(lambda a: rl.LogCoshLoss(a=a)(pred, target))(jnp.asarray(0.5))
    assert_close(got, rl.LogCoshLoss(a=0.5)(pred, target), rtol=1e-14)


def test_stft_phase_gradient_at_silence_is_finite():
    # Before: all NaN. The angle of a zero bin has derivative 0 (as torch's).
    zeros = jnp.zeros(4096)
    grad = jax.grad(lambda p: rl.STFTLoss(w_phs=1.0)(p, zeros))(zeros)
    assert bool(jnp.all(grad == 0))
    # away from silence the phase term's derivative is unchanged: against
    # finite differences in float64 on a short signal
    pred, target = (jnp.asarray(v) for v in _signals((64,), seed=4))
    # (an odd window in an even FFT: no frame is symmetric, so no bin lies on
    # the negative real axis, where the phase jumps by 2 pi)
    loss = rl.STFTLoss(16, 4, 15, w_sc=0.0, w_log_mag=0.0, w_phs=1.0)
    direction = jnp.asarray(np.random.default_rng(5).standard_normal(64))
    h = 1e-6
    fd = (loss(pred + h * direction, target) - loss(pred - h * direction, target)) / (
        2 * h
    )
    analytic = jnp.vdot(jax.grad(lambda p: loss(p, target))(pred), direction)
    assert_close(analytic, fd, rtol=1e-6)


SPECTRAL = {
    "STFT": lambda: rl.STFTLoss(),
    "MRSTFT": lambda: rl.MultiResolutionSTFTLoss(),
    "Mel": lambda: rl.MelSTFTLoss(16_000, n_mels=64),
    "Chroma": lambda: rl.ChromaSTFTLoss(16_000, n_chroma=12),
    "SumAndDifference": lambda: rl.SumAndDifferenceSTFTLoss(
        [512, 256], [128, 64], [512, 256]
    ),
    "scale_invariance": lambda: rl.STFTLoss(scale_invariance=True, w_lin_mag=1.0),
    # (an odd window: see `test_stft_phase_gradient_at_silence_is_finite`)
    "phase": lambda: rl.STFTLoss(1024, 256, 1023, w_phs=1.0),
}


@pytest.mark.parametrize("name", list(SPECTRAL))
def test_spectral_losses_of_loud_signals_are_finite(name):
    # Before: inf or NaN for signals at 1e20 in float32 (squared magnitudes
    # above 3.4e38). Spectral convergence, the log-magnitude distance and
    # the phase are unchanged by a common scale; the linear-magnitude
    # distance scales with it.
    loss = SPECTRAL[name]()
    pred, target = _signals((2, 4096), seed=6)
    want = loss(jnp.asarray(pred), jnp.asarray(target))
    if name == "scale_invariance":
        want = want + (1e20 - 1) * rl.STFTLoss(
            scale_invariance=True, w_sc=0.0, w_log_mag=0.0, w_lin_mag=1.0
        )(jnp.asarray(pred), jnp.asarray(target))
    loud = [jnp.asarray(v * 1e20, jnp.float32) for v in (pred, target)]
    got = loss(*loud)
    assert bool(jnp.isfinite(got))
    assert_close(got, want, rtol=2e-4)
    grad = jax.grad(lambda p: loss(p, loud[1]))(loud[0])
    assert bool(jnp.all(jnp.isfinite(grad)))
    # a loud prediction of a quiet target: finite (the spectral convergence
    # is about the ratio of their scales)
    lopsided = loss(loud[0], jnp.asarray(target, jnp.float32))
    assert bool(jnp.isfinite(lopsided)) and float(lopsided) > 1e18


@pytest.mark.loud
def test_spectral_loss_value_beyond_the_dtype_raises():
    # the L2 linear-magnitude distance of spectra near 1e22 is near 1e44
    loss = rl.STFTLoss(w_lin_mag=1.0, mag_distance="L2")
    pred, target = _signals((2, 4096), seed=7)
    args = (jnp.asarray(pred * 1e20, jnp.float32), jnp.asarray(target, jnp.float32))
    with pytest.raises(eqx.EquinoxRuntimeError, match=OVERFLOW):
        loss(*args)
    with pytest.raises(eqx.EquinoxRuntimeError, match=OVERFLOW):
        eqx.filter_jit(loss)(*args)
