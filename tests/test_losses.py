"""`retrax.losses`: the STFT losses against auraloss (or its stored values),
an independent numpy reference, derivatives, transformations and bad input."""

import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

from helpers import assert_close, raises_eagerly_and_under_jit
from retrax.losses import (
    MelBandEnergyLoss,
    MultiResolutionSTFTLoss,
    STFTLoss,
    mel_filterbank,
    multi_resolution_stft_loss,
)


DATA = pathlib.Path(__file__).parent / "data"
_spec = importlib.util.spec_from_file_location(
    "stft_loss_reference", DATA / "stft_loss_reference.py"
)
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)
STORED = json.loads((DATA / "stft_loss_reference.json").read_text())
HAVE_AURALOSS = importlib.util.find_spec("auraloss") is not None
CASES = reference.signals()


@pytest.fixture(scope="module")
def auraloss_reference():
    """auraloss's values for `CASES`, computed now when auraloss is
    importable, otherwise those stored for the same seeded inputs."""
    for name, (pred, target) in CASES.items():
        stored = STORED["cases"][name]
        assert list(pred.shape) == stored["shape"]
        # The stored numbers belong to these very signals.
        np.testing.assert_allclose(
            reference.fingerprint(pred), stored["pred_fingerprint"], rtol=1e-12
        )
        np.testing.assert_allclose(
            reference.fingerprint(target), stored["target_fingerprint"], rtol=1e-12
        )
    if HAVE_AURALOSS:
        return {
            dtype: reference.auraloss_values(CASES, dtype)
            for dtype in ("float32", "float64")
        }
    return {
        dtype: {name: STORED["cases"][name][dtype] for name in CASES}
        for dtype in ("float32", "float64")
    }


@pytest.mark.parametrize(
    "name, dtype, rtol",
    [(name, "float32", 1e-5) for name in CASES] + [("batch", "float64", 1e-12)],
)
def test_multi_resolution_matches_auraloss(auraloss_reference, name, dtype, rtol):
    pred, target = (a.astype(dtype) for a in CASES[name])
    out = jax.jit(MultiResolutionSTFTLoss())(pred, target)
    assert out.shape == () and out.dtype == dtype
    assert_close(out, auraloss_reference[dtype][name], rtol=rtol)
    assert_close(jax.jit(multi_resolution_stft_loss)(pred, target), out, rtol=rtol)


def np_stft_loss(pred, target, fft, hop, win, window, w_sc, w_log, w_lin, eps, *how):
    """One resolution in numpy, from scipy's periodic windows and a frame loop."""
    w = scipy.signal.get_window(window.removesuffix("_window"), win, fftbins=True)
    left = (fft - win) // 2
    w = np.pad(w, (left, fft - win - left))

    red, dist = how

    def mag(x):
        x = x.reshape(-1, x.shape[-1])
        x = np.pad(x, [(0, 0), (fft // 2, fft // 2)], "reflect")
        frames = [x[:, m : m + fft] * w for m in range(0, x.shape[-1] - fft + 1, hop)]
        spec = np.fft.rfft(np.stack(frames, axis=1), axis=-1)
        return np.sqrt(np.maximum(np.abs(spec) ** 2, eps))

    def d(a, b):
        e = np.abs(a - b) if dist == "L1" else (a - b) ** 2
        return e.mean() if red == "mean" else e.sum()

    x, y = mag(pred), mag(target)
    sc = np.linalg.norm(y - x) / np.linalg.norm(y)
    return w_sc * sc + w_log * d(np.log(x), np.log(y)) + w_lin * d(x, y)


@pytest.mark.parametrize(
    "window, red, dist",
    [
        ("hamming_window", "sum", "L2"),
        ("blackman_window", "mean", "L1"),
        ("bartlett_window", "mean", "L2"),
        ("hann_window", "sum", "L1"),
    ],
)
def test_stft_loss_matches_numpy(window, red, dist):
    rng = np.random.default_rng(3)
    pred, target = rng.standard_normal((2, 2, 3, 100))
    settings = (64, 10, 50, window, 0.7, 1.3, 0.4, 1e-6, red, dist)
    loss = jax.jit(STFTLoss(*settings))
    assert_close(loss(pred, target), np_stft_loss(pred, target, *settings))


def test_windows_match_scipy():
    from retrax.losses._stft import analysis_window

    for name in ("hann_window", "hamming_window", "blackman_window", "bartlett_window"):
        for n in (7, 8, 240):
            expected = scipy.signal.get_window(name[:-7], n, fftbins=True)
            left = (256 - n) // 2
            assert_close(analysis_window(name, n, 256)[left : left + n], expected)


def test_batch_rule_is_auraloss():
    # Norms and means over the whole input: the layout of the examples does
    # not matter, and the batch loss is not the mean of the examples' losses.
    pred, target = np.random.default_rng(4).standard_normal((2, 3, 2, 40))
    loss = jax.jit(MultiResolutionSTFTLoss((32,), (8,), (20,)))
    whole = loss(pred, target)
    assert_close(loss(pred.reshape(1, 6, -1), target.reshape(1, 6, -1)), whole)
    assert_close(loss(pred.reshape(6, -1), target.reshape(6, -1)), whole)
    per_example = jax.vmap(loss)(pred, target)
    for b in range(3):
        assert_close(per_example[b], loss(pred[b], target[b]))
    assert abs(float(jnp.mean(per_example)) - float(whole)) > 1e-6


def test_gradients_small_resolutions():
    rng = np.random.default_rng(5)
    pred, target = rng.standard_normal((2, 2, 48))
    loss = MultiResolutionSTFTLoss((16, 32), (4, 8), (12, 32), w_lin_mag=0.5)
    jax.test_util.check_grads(
        jax.jit(loss), (pred, target), order=1, modes=("fwd", "rev"), eps=1e-6
    )


def test_gradient_default_settings():
    pred, target = CASES["mono"]
    f = jax.jit(lambda p: MultiResolutionSTFTLoss()(p, target))
    jax.test_util.check_grads(f, (pred,), order=1, modes=("rev",), eps=1e-6)
    # At the optimum the gradient is zero, not NaN.
    g = jax.grad(f)(target)
    assert np.all(np.asarray(g) == 0)


def test_dtypes():
    pred, target = np.random.default_rng(7).standard_normal((2, 2, 32))
    loss = jax.jit(STFTLoss(32, 8, 32))
    assert loss(pred.astype(np.float32), target.astype(np.float32)).dtype == jnp.float32
    assert loss(pred, target).dtype == jnp.float64
    assert loss(pred.astype(np.float32), target).dtype == jnp.float64


def test_bad_settings():
    cases = [
        (dict(fft_sizes=(0, 2048, 512)), "fft_size"),
        (dict(hop_sizes=(120, 0, 50)), "hop_size"),
        (dict(win_lengths=(600, 4096, 240)), "win_length"),
        (dict(hop_sizes=(120, 240)), "hop_sizes"),
        (dict(fft_sizes=(), hop_sizes=(), win_lengths=()), "fft_sizes"),
        (dict(window="kaiser_window"), "window"),
        (dict(reduction="none"), "reduction"),
        (dict(mag_distance="L3"), "mag_distance"),
        (dict(eps=0.0), "eps"),
        (dict(w_sc=-1.0), "w_sc"),
        (dict(w_log_mag=float("nan")), "w_log_mag"),
        (dict(w_lin_mag=-0.5), "w_lin_mag"),
    ]
    for settings, name in cases:
        # The test suite's type checker rejects the strings outside the
        # `Literal`s first (a TypeError naming the argument too).
        with pytest.raises((ValueError, TypeError), match=name):
            MultiResolutionSTFTLoss(**settings)


def test_bad_signals():
    pred, target = np.random.default_rng(6).standard_normal((2, 2, 64))
    loss = MultiResolutionSTFTLoss((64, 32), (16, 8), (64, 20))
    bad_shapes = [
        ((pred, target[0]), "same shape"),
        ((pred[:, :63], target[:, :63]), "fewer than the largest `fft_size` \\(64\\)"),
        ((pred[None, None], target[None, None]), "`pred` must have shape"),
        ((pred + 0j, target), "pred"),  # the type checker's message or ours
    ]
    for args, match in bad_shapes:
        raises_eagerly_and_under_jit(loss, *args, match=match)
    nan_pred = pred.copy()
    nan_pred[1, 5] = np.nan
    raises_eagerly_and_under_jit(loss, nan_pred, target, match="`pred` contains")
    inf_target = target.copy()
    inf_target[0, 0] = np.inf
    raises_eagerly_and_under_jit(loss, pred, inf_target, match="`target` contains")


def test_mel_filterbank_matches_librosa():
    if importlib.util.find_spec("librosa") is not None:
        expected = reference.librosa_mel_filterbanks()
    else:
        expected = STORED["mel_filterbanks"]
    for settings, bank in zip(reference.MEL_SETTINGS, expected, strict=True):
        out = mel_filterbank(
            settings["sr"],
            settings["n_fft"],
            settings["n_mels"],
            settings["fmin"],
            settings["fmax"],
        )
        assert_close(out, np.asarray(bank))


def test_mel_band_energy_loss():
    rng = np.random.default_rng(8)
    pred, target = rng.standard_normal((2, 2, 80))
    loss = MelBandEnergyLoss(16000, 64, 16, 48, n_mels=8, f_min=30.0, eps=1e-6)
    w = np.pad(scipy.signal.get_window("hann", 48, fftbins=True), (8, 8))
    bank = mel_filterbank(16000, 64, 8, 30.0)

    def energies(x):
        x = np.pad(x, [(0, 0), (32, 32)], "reflect")
        frames = [x[:, m : m + 64] * w for m in range(0, x.shape[-1] - 64 + 1, 16)]
        return np.abs(np.fft.rfft(np.stack(frames, axis=1), axis=-1)) ** 2 @ bank.T

    expected = np.mean(
        np.abs(np.log(energies(pred) + 1e-6) - np.log(energies(target) + 1e-6))
    )
    f = jax.jit(loss)
    assert_close(f(pred, target), expected)
    jax.test_util.check_grads(
        lambda p: f(p, target), (pred,), order=1, modes=("rev",), eps=1e-6
    )
    assert np.all(np.asarray(jax.grad(lambda p: f(p, target))(target)) == 0)
    for settings, name in [
        (dict(sample_rate=0), "sample_rate"),
        (dict(sample_rate=16000, n_mels=0), "n_mels"),
        (dict(sample_rate=16000, f_min=9000.0), "f_min"),
        (dict(sample_rate=16000, hop_size=0), "hop_size"),
        (dict(sample_rate=16000, win_length=4096), "win_length"),
        (dict(sample_rate=16000, eps=-1.0), "eps"),
    ]:
        with pytest.raises((ValueError, TypeError), match=name):
            MelBandEnergyLoss(**settings)
    raises_eagerly_and_under_jit(loss, pred[:, :63], target[:, :63], match="fewer")


@pytest.mark.float32
def test_float32_process_matches_auraloss(auraloss_reference):
    # With x64 off, as users run: float64 NumPy input becomes float32.
    pred, target = CASES["stereo"]
    loss = jax.jit(MultiResolutionSTFTLoss())
    out = loss(pred, target)
    assert out.dtype == jnp.float32
    assert_close(out, auraloss_reference["float32"]["stereo"], rtol=1e-5)
    grad = jax.grad(loss)(pred, target)
    assert grad.dtype == jnp.float32 and np.all(np.isfinite(grad))
