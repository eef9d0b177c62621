"""`retrax.losses`: the STFT losses against auraloss (or its stored values),
an independent numpy reference, derivatives, transformations and bad input;
the fractional-octave bands against IEC 61260-1 and scipy's Butterworth
filters; energy decay curves and decay times against numpy and decaying
noise of known decay time."""

import importlib.util
import json
import pathlib

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

from helpers import assert_close, raises_eagerly_and_under_jit, unchecked
from retrax.losses import (
    EnergyDecayLoss,
    MelBandEnergyLoss,
    MultiResolutionSTFTLoss,
    OctaveBandEnergyLoss,
    STFTLoss,
    energy_decay_curve,
    mel_filterbank,
    multi_resolution_stft_loss,
    octave_band_sos,
    octave_band_split,
    octave_bands,
    octave_filterbank,
    t60_from_edc,
)


DATA = pathlib.Path(__file__).parents[1] / "data"
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
    # At the optimum the gradient is zero, not NaN. Both spectra come from the
    # same compiled code (the target traced, not a constant that XLA may fold
    # with other rounding), so their difference is exactly zero.
    g = jax.jit(jax.grad(lambda p, t: MultiResolutionSTFTLoss()(p, t)))(target, target)
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
        (dict(window="gaussian_window"), "window"),
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


# --- fractional-octave bands ---------------------------------------------------


def test_octave_bands_are_iec_61260():
    lower, centre, upper = octave_bands(1, 125, 8000)
    nominal = [125, 250, 500, 1000, 2000, 4000, 8000]
    assert_close(centre, 1000 * 10.0 ** (0.3 * np.arange(-3, 4)))
    assert np.all(np.abs(centre / nominal - 1) < 0.01)
    assert_close(upper / lower, np.full(7, 10.0**0.3))
    lower, centre, upper = octave_bands(3, 100, 5000)
    assert len(centre) == 18 and centre[10] == 1000.0
    assert_close(centre, 1000 * 10.0 ** (0.1 * np.arange(-10, 8)))
    assert_close(lower[1:], upper[:-1])  # the bands tile the range
    assert_close(octave_bands(2, 1000, 1000)[1], [1000 * 10 ** (0.15 / 2)])
    assert octave_bands(1, 1100, 1300)[1].tolist() == [1000.0]  # its band
    for args, name in [((0,), "fraction"), ((1, 0.0), "f_min"),
                       ((1, 500, 100), "f_max")]:  # fmt: skip
        with pytest.raises(ValueError, match=name):
            octave_bands(*args)


def test_octave_filterbank():
    bank = octave_filterbank(16000, 512, 3, 200, 4000)
    lower, _, upper = octave_bands(3, 200, 4000)
    freqs = np.arange(257) * 16000 / 512
    assert bank.shape == (len(lower), 257)
    for row, lo, hi in zip(bank, lower, upper, strict=True):
        assert np.array_equal(row, ((freqs >= lo) & (freqs < hi)).astype(float))
    covered = (freqs >= lower[0]) & (freqs < upper[-1])
    assert np.array_equal(bank.sum(axis=0), covered.astype(float))
    top = octave_filterbank(16000, 512, 1, 125)[-1]  # f_max=None: up to 8 kHz
    assert top[-1] == 0 and octave_bands(1, 4000, 4000)[2][0] < 8000
    with pytest.raises(ValueError, match="holds no FFT bin at `fft_size`=512"):
        octave_filterbank(16000, 512, 3, 50)
    with pytest.raises(ValueError, match="above the Nyquist frequency"):
        octave_filterbank(16000, 512, 1, 125, 8000)
    with pytest.raises(ValueError, match="sample_rate"):
        octave_filterbank(-1, 512)


def test_octave_band_split_is_scipy_butterworth():
    sos = octave_band_sos(8000, 1, 125, 2000, order=3)
    lower, _, upper = octave_bands(1, 125, 2000)
    assert sos.shape == (5, 3, 6)
    for band, lo, hi in zip(sos, lower, upper, strict=True):
        ref = scipy.signal.butter(3, [lo, hi], "bandpass", fs=8000, output="sos")
        assert_close(band, ref)
    x = np.random.default_rng(40).standard_normal((2, 300))
    split = jax.jit(lambda x: octave_band_split(x, 8000, 1, 125, 2000))(x)
    assert split.shape == (2, 5, 300)
    ref = np.stack([scipy.signal.sosfilt(s, x, axis=-1) for s in sos], axis=-2)
    assert_close(split, ref, rtol=1e-10)
    with pytest.raises(ValueError, match="order"):
        octave_band_sos(8000, order=0)


def test_octave_band_energy_loss():
    rng = np.random.default_rng(41)
    pred, target = rng.standard_normal((2, 2, 300))
    loss = OctaveBandEnergyLoss(8000, 256, 64, fraction=3, f_min=200.0, eps=1e-6)
    w = scipy.signal.get_window("hann", 256, fftbins=True)
    bank = octave_filterbank(8000, 256, 3, 200.0)

    def energies(x):
        x = np.pad(x, [(0, 0), (128, 128)], "reflect")
        frames = [x[:, m : m + 256] * w for m in range(0, x.shape[-1] - 255, 64)]
        return np.abs(np.fft.rfft(np.stack(frames, axis=1), axis=-1)) ** 2 @ bank.T

    expected = np.mean(
        np.abs(np.log(energies(pred) + 1e-6) - np.log(energies(target) + 1e-6))
    )
    f = jax.jit(loss)
    assert_close(f(pred, target), expected)
    grad = jax.grad(lambda p: f(p, target))
    jax.test_util.check_grads(
        lambda p: f(p, target), (pred,), order=1, modes=("rev",), eps=1e-6
    )
    assert np.all(np.asarray(grad(target)) == 0)
    for settings, name in [
        (dict(sample_rate=0), "sample_rate"),
        (dict(sample_rate=8000, fraction=0), "fraction"),
        (dict(sample_rate=8000, fft_size=64), "fft_size"),
        (dict(sample_rate=8000, f_max=4000.0), "f_max"),
        (dict(sample_rate=8000, hop_size=0), "hop_size"),
        (dict(sample_rate=8000, eps=0.0), "eps"),
    ]:
        with pytest.raises(ValueError, match=name):
            OctaveBandEnergyLoss(**settings)


# --- energy decay curves and decay times --------------------------------------


def np_edc(x, normalize=True, eps=0.0):
    energy = np.cumsum(x[..., ::-1] ** 2, axis=-1)[..., ::-1]
    if normalize:
        energy = energy / energy[..., :1]
    return 10 * np.log10(energy + eps)


def decaying_noise(rng, t60, fs, seconds):
    """White noise whose energy falls by 60 dB every `t60` seconds."""
    t = np.arange(int(seconds * fs)) / fs
    return rng.standard_normal(t.size) * 10.0 ** (-3 * t / t60)


def test_energy_decay_curve():
    x = np.random.default_rng(42).standard_normal((3, 50))
    assert_close(energy_decay_curve(x), np_edc(x))
    assert_close(jax.jit(energy_decay_curve)(x)[:, 0], np.zeros(3), atol=1e-12)
    assert_close(energy_decay_curve(x, normalize=False, eps=1e-3),
                 np_edc(x, False, 1e-3))  # fmt: skip
    silent = energy_decay_curve(np.zeros(4), eps=1e-10)
    assert_close(silent, np.full(4, -100.0))
    for bad, name in [(dict(eps=-1.0), "eps"), (dict(eps=np.inf), "eps")]:
        with pytest.raises(ValueError, match=name):
            energy_decay_curve(x, **bad)
    with pytest.raises(ValueError, match="`x` must be real signals"):
        unchecked(energy_decay_curve)(np.zeros(()))


def test_t60_of_decaying_noise():
    rng = np.random.default_rng(43)
    fs = 8000
    t60s = np.array([0.25, 0.6, 1.1])
    x = np.stack([decaying_noise(rng, t60, fs, 2.2) for t60 in t60s])
    measured = jax.jit(lambda x: t60_from_edc(energy_decay_curve(x), fs))(x)
    assert np.all(np.abs(measured / t60s - 1) < 0.03), measured
    # a straight line is fitted exactly; batched under jit and vmap
    t = np.arange(400) / fs
    lines = -60 * t / np.array([[0.02], [0.03]])
    f = jax.jit(lambda e: t60_from_edc(e, fs))
    assert_close(f(lines), [0.02, 0.03])
    assert_close(jax.vmap(f)(lines), [0.02, 0.03])
    # its derivative: the fitted slope is linear in the samples in the range
    # (and does not depend on the start level, sample 0, but for rounding)
    g = np.asarray(jax.grad(lambda e: t60_from_edc(e, fs))(lines[0]))
    inside = (lines[0] <= -5) & (lines[0] >= -35)
    assert np.all(g[1:][~inside[1:]] == 0) and np.all(np.isfinite(g))
    assert abs(g[0]) < 1e-12 * np.max(np.abs(g))


def test_t60_from_edc_bad_inputs():
    fs = 8000
    short = -60 * np.arange(100) / fs / 0.1  # falls 7.5 dB only
    raises_eagerly_and_under_jit(lambda e: t60_from_edc(e, fs), short,
                                 match="does not fall to -35.0 dB")  # fmt: skip
    steep = np.array([0.0, -10.0, -100.0])
    raises_eagerly_and_under_jit(lambda e: t60_from_edc(e, fs), steep,
                                 match="fewer than two samples")  # fmt: skip
    rising = np.array([0.0, -50.0, -36.0, -30.0, -20.0, -6.0, -40.0])
    raises_eagerly_and_under_jit(lambda e: t60_from_edc(e, fs), rising,
                                 match="does not decay")  # fmt: skip
    start = np.array([-np.inf, -50.0])
    raises_eagerly_and_under_jit(lambda e: t60_from_edc(e, fs), start,
                                 match="finite at its first sample")  # fmt: skip
    line = -60 * np.arange(400) / fs / 0.02
    for bad, name in [(dict(start_db=-40.0), "start_db"),
                      (dict(start_db=1.0), "start_db"),
                      (dict(sample_rate=0.0), "sample_rate")]:  # fmt: skip
        kwargs = dict(sample_rate=fs) | bad
        with pytest.raises(ValueError, match=name):
            t60_from_edc(line, **kwargs)


def test_energy_decay_loss():
    rng = np.random.default_rng(44)
    fs = 8000
    pred = decaying_noise(rng, 0.05, fs, 0.05)[None] * [[1.0], [0.5]]
    target = decaying_noise(rng, 0.04, fs, 0.05)[None] * [[1.0], [2.0]]
    loss = EnergyDecayLoss(eps=1e-7)
    expected = np.mean(np.abs(np_edc(pred, eps=1e-7) - np_edc(target, eps=1e-7)))
    assert_close(jax.jit(loss)(pred, target), expected)
    assert np.all(np.asarray(jax.grad(loss)(target, target)) == 0)
    absolute = EnergyDecayLoss(normalize=False, eps=1e-7, distance="L2")
    expected = np.mean((np_edc(pred, False, 1e-7) - np_edc(target, False, 1e-7)) ** 2)
    assert_close(absolute(pred, target), expected)
    banded = EnergyDecayLoss(fs, 1, 250, 2000, eps=1e-7)
    sos = octave_band_sos(fs, 1, 250, 2000)

    def np_bands(x):
        return np.stack([scipy.signal.sosfilt(s, x, axis=-1) for s in sos], -2)

    expected = np.mean(np.abs(np_edc(np_bands(pred), eps=1e-7)
                              - np_edc(np_bands(target), eps=1e-7)))  # fmt: skip
    f = jax.jit(banded)
    assert_close(f(pred, target), expected, rtol=1e-9)
    grad = jax.grad(lambda p: f(p, target))
    assert np.all(np.isfinite(grad(pred)))
    jax.test_util.check_grads(
        lambda p: f(p, target), (pred,), order=1, modes=("rev",), eps=1e-7
    )
    for settings, name in [
        (dict(fraction=1), "sample_rate"),
        (dict(sample_rate=fs, fraction=0), "fraction"),
        (dict(sample_rate=fs, fraction=1, f_max=4000.0), "f_max"),
        (dict(eps=0.0), "eps"),
        (dict(distance="L3"), "distance"),
    ]:
        with pytest.raises((ValueError, TypeError), match=name):
            EnergyDecayLoss(**settings)
    bad = np.array(target)
    bad[0, 3] = np.nan
    raises_eagerly_and_under_jit(loss, pred, bad, match="`target` contains")


@pytest.mark.float32
def test_float32_decay_time_and_loss():
    rng = np.random.default_rng(45)
    fs = 8000
    x = jnp.asarray(decaying_noise(rng, 0.4, fs, 0.8), jnp.float32)
    edc = jax.jit(energy_decay_curve)(x)
    assert edc.dtype == jnp.float32
    assert_close(edc, np_edc(np.asarray(x, np.float64)), rtol=1e-5)
    t60 = jax.jit(lambda e: t60_from_edc(e, fs))(edc)
    assert t60.dtype == jnp.float32 and abs(t60 / 0.4 - 1) < 0.03
    loss = jax.jit(EnergyDecayLoss(fs, 1, 250, 2000))
    value, grad = jax.value_and_grad(loss)(x, 0.5 * x[::-1])
    assert value.dtype == grad.dtype == jnp.float32
    assert np.all(np.isfinite(grad))


@pytest.mark.full
def test_eager_call_is_the_jitted_call():
    # `__call__` compiles the loss as a whole; an eager call, a jitted one and
    # a gradient through either give the same numbers, and a weight given as
    # a Python zero still skips its term (it stays static, not traced).
    from retrax.losses import MelSTFTLoss, SumAndDifferenceSTFTLoss

    key1, key2 = jax.random.split(jax.random.key(3))
    pred = jax.random.normal(key1, (2, 2, 2048), jnp.float32)
    target = jax.random.normal(key2, (2, 2, 2048), jnp.float32)
    losses = [
        STFTLoss(fft_size=256, hop_size=64, win_length=256, w_sc=0.0),
        MelSTFTLoss(44100, fft_size=512, hop_size=128, win_length=512, n_mels=32),
        MultiResolutionSTFTLoss(
            fft_sizes=(128, 256), hop_sizes=(32, 64), win_lengths=(128, 256)
        ),
        SumAndDifferenceSTFTLoss(
            fft_sizes=(128, 256), hop_sizes=(32, 64), win_lengths=(128, 256)
        ),
    ]
    for loss in losses:
        eager = loss(pred, target)
        jitted = jax.jit(lambda p, t, loss=loss: loss(p, t))(pred, target)
        assert_close(eager, jitted, rtol=1e-6)
        g_eager = jax.grad(lambda p, loss=loss: loss(p, target))(pred)
        g_jit = jax.jit(jax.grad(lambda p, loss=loss: loss(p, target)))(pred)
        assert_close(g_eager, g_jit, rtol=1e-5, atol=1e-9)
    full = STFTLoss(fft_size=256, hop_size=64, win_length=256, w_sc=0.0, output="full")
    terms = full(pred, target)
    assert float(terms.sc_mag) == 0.0 and float(terms.log_mag) > 0.0
    # A traced zero weight is honoured too: the term is computed and weighed.
    traced = jax.jit(lambda w: eqx.tree_at(lambda m: m.w_sc, full, w)(pred, target))
    assert float(traced(jnp.float32(0.0)).sc_mag) > 0.0


def test_inexact_arrays_pass_without_a_primitive():
    # Under an eager `jax.grad` every primitive costs a linearisation, so the
    # checks leave an array of the right dtype untouched.
    from retrax._misc import as_inexact, cast

    jaxpr = jax.make_jaxpr(lambda x: cast(as_inexact("x", x), x.dtype))(
        jnp.ones(3, jnp.float32)
    )
    assert not jaxpr.eqns
    assert cast(jnp.ones(3, jnp.float32), jnp.float64).dtype == jnp.float64
    weak = jnp.asarray(1.0)
    assert not jax.typeof(cast(weak, weak.dtype)).weak_type


RATE = r"`sample_rate` must be a positive, finite number"


@pytest.mark.loud
@pytest.mark.parametrize("rate", [np.inf, -np.inf, np.nan, 0.0, -8000.0])
def test_losses_refuse_a_sample_rate_that_is_not_finite_and_positive(rate):
    for make in [
        lambda: MelBandEnergyLoss(sample_rate=rate),
        lambda: OctaveBandEnergyLoss(rate),
        lambda: EnergyDecayLoss(sample_rate=rate),
        lambda: EnergyDecayLoss(sample_rate=rate, fraction=1),
    ]:
        with pytest.raises(ValueError, match=RATE):
            make()
    line = -60 * np.arange(400) / 8000 / 0.02
    with pytest.raises(ValueError, match=RATE):
        t60_from_edc(line, rate)


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_t60_refuses_a_curve_with_nan(dtype, bad):
    fs = 48_000
    x = np.exp(-np.arange(fs) / 4000.0) * np.cos(np.arange(fs))
    edc = np.asarray(energy_decay_curve(x.astype(dtype)))
    t60 = float(t60_from_edc(edc, fs))  # the curve itself measures
    assert 0.5 < t60 < 0.6
    broken = edc.copy()
    broken[2000] = bad
    with pytest.raises(ValueError, match=r"`edc` holds NaN or \+inf entries"):
        t60_from_edc(broken, fs)
    with pytest.raises(Exception, match=r"`edc` holds NaN or \+inf entries"):
        jax.jit(lambda e: t60_from_edc(e, fs))(broken).block_until_ready()
    # -inf (no energy left, `eps=0`) is allowed
    tail = np.concatenate([edc, [-np.inf]]).astype(dtype)
    np.testing.assert_allclose(float(t60_from_edc(tail, fs)), t60, rtol=1e-6)
