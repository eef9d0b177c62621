"""auraloss's STFT options (`w_phs`, `scale_invariance`,
`perceptual_weighting`, mel and chroma `scale`, `output="full"`, the Kaiser
window) and its other STFT losses against auraloss 0.4.0 (directly when
installed, else stored values), in value (float32 and float64) and float64
gradient; librosa's chroma filterbank; transformations and bad settings."""

import importlib.util
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.losses as rl


DATA = pathlib.Path(__file__).parents[1] / "data"
_spec = importlib.util.spec_from_file_location(
    "stft_options_reference", DATA / "stft_options_reference.py"
)
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)
STORED = json.loads((DATA / "stft_options_reference.json").read_text())
HAVE_AURALOSS = importlib.util.find_spec("auraloss") is not None
CASES = reference.signals()


def _params(losses):
    return [
        pytest.param(name, case, id=f"{name}-{case}")
        for name, _, _, cases in losses
        for case in cases
    ]


OPTIONS = {name: (cls, kw) for name, cls, kw, _ in reference.LOSSES}
LOSSES = {name: (cls, kw) for name, cls, kw, _ in reference.LOSSES_2}


@pytest.fixture(scope="module")
def expected():
    """auraloss's values: computed now if auraloss is installed, otherwise
    the stored ones, after checking they belong to these inputs."""
    for case, (pred, target) in CASES.items():
        prints = STORED["fingerprints"][case]
        np.testing.assert_allclose(reference.fingerprint(pred), prints["pred"])
        np.testing.assert_allclose(reference.fingerprint(target), prints["target"])
    if HAVE_AURALOSS:
        return reference.auraloss_values(CASES, reference.LOSSES)
    return STORED["options"]


@pytest.fixture(scope="module")
def expected_losses():
    """As `expected`, for auraloss's other STFT losses."""
    for case, (pred, target) in CASES.items():
        prints = STORED["fingerprints"][case]
        np.testing.assert_allclose(reference.fingerprint(pred), prints["pred"])
        np.testing.assert_allclose(reference.fingerprint(target), prints["target"])
    if HAVE_AURALOSS:
        return reference.auraloss_values(CASES, reference.LOSSES_2)
    return STORED["losses"]


def make_retrax(cls, kwargs):
    kwargs = reference.retrax_kwargs(kwargs)
    if cls == "RandomResolutionSTFTLoss":
        # the drawn set auraloss is evaluated at
        loss = rl.RandomResolutionSTFTLoss(**reference.RANDOM_SETTINGS, **kwargs)
        return loss.loss_at(reference.RANDOM_RESOLUTIONS)
    return getattr(rl, cls)(**kwargs)


def flat(out) -> np.ndarray:
    """The loss, or the loss and its terms in auraloss's order."""
    return np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(out)])


def first(out):
    """The loss of a loss or of its terms."""
    return out if isinstance(out, jax.Array) else out.loss


def check_value(loss, name, case, expected, dtype):
    pred, target = (jnp.asarray(x, dtype) for x in CASES[case])
    out = flat(jax.jit(loss)(pred, target))
    want = np.asarray(expected[dtype][name][case])
    assert out.dtype == dtype
    if dtype == "float64":
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-14)
    else:
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)


def check_grad(loss, name, case, expected):
    pred, target = CASES[case]
    grad = jax.jit(jax.grad(lambda p: first(loss(p, target))))(jnp.asarray(pred))
    want = np.asarray(expected["grad"][name][case])
    # the atol scaled to the gradient (the fingerprint's largest entry)
    np.testing.assert_allclose(
        reference.fingerprint(np.asarray(grad)),
        want,
        rtol=1e-10,
        atol=1e-10 * np.abs(want).max(),
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name, case", _params(reference.LOSSES))
def test_options_equal_auraloss(expected, name, case, dtype):
    check_value(make_retrax(*OPTIONS[name]), name, case, expected, dtype)


@pytest.mark.parametrize("name, case", _params(reference.LOSSES))
def test_options_gradient_equals_auraloss_float64(expected, name, case):
    check_grad(make_retrax(*OPTIONS[name]), name, case, expected)


def test_chroma_filterbank_equals_librosa():
    if importlib.util.find_spec("librosa") is not None:
        want = reference.librosa_chroma_filterbanks()
    else:
        want = STORED["chroma_filterbanks"]
    for settings, bank in zip(reference.CHROMA_SETTINGS, want, strict=True):
        s = dict(settings)
        got = rl.chroma_filterbank(s.pop("sr"), s.pop("n_fft"), **s)
        assert got.shape == (settings["n_chroma"], settings["n_fft"] // 2 + 1)
        np.testing.assert_allclose(got, np.asarray(bank), rtol=1e-12, atol=1e-15)


def test_lower_ranks_are_one_example_and_vmap_gives_per_example():
    loss = rl.STFTLoss(
        128, 32, 128, w_phs=0.3, perceptual_weighting=True, sample_rate=16000
    )
    pred, target = CASES["batch"]
    full = loss(pred[0, 0], target[0, 0])
    np.testing.assert_allclose(loss(pred[:1, :1], target[:1, :1]), full, rtol=1e-13)
    np.testing.assert_allclose(loss(pred[0, :1], target[0, :1]), full, rtol=1e-13)
    per_example = jax.vmap(loss)(pred, target)
    for b in range(pred.shape[0]):
        np.testing.assert_allclose(per_example[b], loss(pred[b], target[b]), rtol=1e-13)


def test_scale_invariance_is_per_signal():
    # each channel of each example gets its own optimal scale: a target that
    # is a per-channel rescaled prediction costs nothing
    loss = rl.STFTLoss(128, 32, 128, scale_invariance=True, w_lin_mag=1.0)
    pred = CASES["batch"][0]
    target = pred * np.array([0.5, 2.0])[None, :, None]
    terms = rl.STFTLoss(
        128, 32, 128, scale_invariance=True, w_lin_mag=1.0, output="full"
    )(pred, target)
    assert float(loss(pred, target)) < 1e-6
    assert float(terms.sc_mag) < 1e-6 and float(terms.lin_mag) < 1e-6


def test_full_output_is_the_weighted_sum():
    pred, target = CASES["stereo"]
    settings = dict(w_sc=0.5, w_log_mag=2.0, w_lin_mag=0.3, w_phs=0.1)
    terms = rl.STFTLoss(128, 32, 100, output="full", **settings)(pred, target)
    total = (
        0.5 * terms.sc_mag + 2.0 * terms.log_mag + 0.3 * terms.lin_mag + 0.1 * terms.phs
    )
    np.testing.assert_allclose(terms.loss, total, rtol=1e-13)
    np.testing.assert_allclose(
        rl.STFTLoss(128, 32, 100, **settings)(pred, target), terms.loss, rtol=1e-13
    )
    mr = rl.MultiResolutionSTFTLoss(
        (128, 64), (32, 16), (100, 64), output="full", w_phs=0.2
    )(pred, target)
    assert mr.sc_mag.shape == mr.phs.shape == (2,)
    # unused terms are zero, as in auraloss
    assert float(rl.STFTLoss(64, 16, 64, output="full")(pred, target).phs) == 0.0


def test_options_under_vmap_and_traced_weights():
    loss_of = lambda w: rl.MultiResolutionSTFTLoss(  # noqa: E731
        (128, 64),
        (32, 16),
        (100, 64),
        w_phs=w,
        scale="mel",
        n_bins=16,
        sample_rate=16000,
        perceptual_weighting=True,
    )
    pred, target = CASES["batch"]
    values = jax.jit(jax.vmap(lambda w: loss_of(w)(pred, target)))(
        jnp.array([0.0, 0.5])
    )
    np.testing.assert_allclose(values[1], loss_of(0.5)(pred, target), rtol=1e-12)
    np.testing.assert_allclose(values[0], loss_of(0.0)(pred, target), rtol=1e-12)


@pytest.mark.parametrize(
    "settings, name",
    [
        (dict(scale="bark", n_bins=8, sample_rate=16000), "scale"),
        (dict(scale="mel", n_bins=8), "sample_rate"),
        (dict(scale="chroma", sample_rate=16000), "n_bins"),
        (dict(scale="mel", n_bins=0, sample_rate=16000), "n_bins"),
        (dict(scale="mel", n_bins=300, sample_rate=16000), "n_bins"),
        (dict(scale="mel", n_bins=8, sample_rate=-1.0), "sample_rate"),
        (dict(perceptual_weighting=True), "sample_rate"),
        (dict(perceptual_weighting=1), "perceptual_weighting"),
        (dict(scale_invariance="yes"), "scale_invariance"),
        (dict(output="all"), "output"),
        (dict(w_phs=-1.0), "w_phs"),
        (dict(w_phs=float("inf")), "w_phs"),
    ],
)
def test_bad_option_settings_raise_naming_the_argument(settings, name):
    # the test suite's type checker rejects values outside the annotations
    # first (a TypeError naming the argument too)
    with pytest.raises((ValueError, TypeError), match=name):
        rl.STFTLoss(256, 64, 256, **settings)
    with pytest.raises((ValueError, TypeError), match=name):
        rl.MultiResolutionSTFTLoss((256,), (64,), (256,), **settings)


def test_bad_windows_sequence():
    with pytest.raises(ValueError, match="window"):
        rl.MultiResolutionSTFTLoss((64, 32), (16, 8), (64, 32), window=("hann_window",))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name, case", _params(reference.LOSSES_2))
def test_losses_equal_auraloss(expected_losses, name, case, dtype):
    check_value(make_retrax(*LOSSES[name]), name, case, expected_losses, dtype)


@pytest.mark.parametrize("name, case", _params(reference.LOSSES_2))
def test_losses_gradient_equals_auraloss_float64(expected_losses, name, case):
    check_grad(make_retrax(*LOSSES[name]), name, case, expected_losses)


def test_mel_and_chroma_losses_are_scaled_stft_losses():
    pred, target = CASES["stereo"]
    mel = rl.MelSTFTLoss(16000, 128, 32, 100, n_mels=20, w_phs=0.1)
    want = rl.STFTLoss(
        128, 32, 100, w_phs=0.1, scale="mel", n_bins=20, sample_rate=16000
    )
    np.testing.assert_allclose(mel(pred, target), want(pred, target), rtol=1e-14)
    chroma = rl.ChromaSTFTLoss(16000, 128, 32, 100, w_lin_mag=0.5)
    want = rl.STFTLoss(
        128, 32, 100, w_lin_mag=0.5, scale="chroma", n_bins=12, sample_rate=16000
    )
    np.testing.assert_allclose(
        jax.jit(chroma)(pred, target), want(pred, target), rtol=1e-14
    )
    with pytest.raises((ValueError, TypeError), match="n_bins"):
        rl.MelSTFTLoss(16000, 64, 16, 64, n_mels=65)
    with pytest.raises((ValueError, TypeError), match="sample_rate"):
        rl.ChromaSTFTLoss(0.0)


def test_sum_and_difference_shapes_and_vmap():
    loss = rl.SumAndDifferenceSTFTLoss((128, 64), (32, 16), (100, 64), w_diff=0.5)
    pred, target = CASES["batch"]
    np.testing.assert_allclose(
        loss(pred[0], target[0]), loss(pred[:1], target[:1]), rtol=1e-14
    )
    per_example = jax.jit(jax.vmap(loss))(pred, target)
    np.testing.assert_allclose(per_example[1], loss(pred[1], target[1]), rtol=1e-12)
    full = rl.SumAndDifferenceSTFTLoss(
        (128, 64), (32, 16), (100, 64), w_diff=0.5, output="full"
    )(pred, target)
    np.testing.assert_allclose(
        full.loss, (full.sum_loss + 0.5 * full.diff_loss) / 2, rtol=1e-14
    )
    with pytest.raises(ValueError, match="stereo"):
        loss(pred[:, :1], target[:, :1])
    with pytest.raises(ValueError, match="stereo"):
        loss(pred[0, 0], target[0, 0])
    with pytest.raises((ValueError, TypeError), match="w_sum"):
        rl.SumAndDifferenceSTFTLoss((64,), (16,), (64,), w_sum=-1.0)
    with pytest.raises((ValueError, TypeError), match="output"):
        rl.SumAndDifferenceSTFTLoss((64,), (16,), (64,), output="both")


@pytest.mark.slow
def test_random_resolutions_follow_auraloss_sampling():
    loss = rl.RandomResolutionSTFTLoss(
        resolutions=4,
        min_fft_size=16,
        max_fft_size=512,
        min_hop_size=0.25,
        windows=("hann_window", "kaiser_window"),
    )
    seen_ffts, seen_fractions, seen_windows = set(), set(), set()
    for seed in range(40):
        drawn = loss.draw(jax.random.key(seed))
        assert len(drawn.resolutions) == 4
        for r in drawn.resolutions:
            assert r.fft_size in (16, 32, 64, 128, 256)  # 512 is never drawn
            assert int(r.fft_size * 0.25) <= r.hop_size <= r.fft_size
            seen_ffts.add(r.fft_size)
            seen_fractions.add(r.win_length / r.fft_size)
            seen_windows.add(r.window)
    assert seen_ffts == {16, 32, 64, 128, 256}
    assert seen_fractions == {1.0, 0.5, 0.25}
    assert seen_windows == {"hann_window", "kaiser_window"}
    # the same key, the same resolutions; the call is the drawn loss
    key = jax.random.key(7)
    assert loss.draw(key) == loss.draw(key)
    pred, target = CASES["stereo"]
    np.testing.assert_allclose(
        loss(pred, target, key=key),
        jax.jit(loss.draw(key))(pred, target),
        rtol=1e-13,
    )
    grad = jax.grad(lambda p: loss(p, target, key=key))(pred)
    assert np.all(np.isfinite(grad))


def test_random_resolution_bad_settings_and_traced_key():
    loss = rl.RandomResolutionSTFTLoss(min_fft_size=16, max_fft_size=512)
    pred, target = CASES["mono"]
    with pytest.raises(TypeError, match="key"):
        jax.jit(lambda k: loss(pred, target, key=k))(jax.random.key(0))
    with pytest.raises(ValueError, match="max_fft_size"):
        rl.RandomResolutionSTFTLoss(max_fft_size=2048)(
            pred, target, key=jax.random.key(0)
        )
    cases = [
        (dict(resolutions=0), "resolutions"),
        (dict(min_fft_size=64, max_fft_size=100), "max_fft_size"),
        (dict(min_hop_size=0.0), "min_hop_size"),
        (dict(min_hop_size=0.5, max_hop_size=0.2), "max_hop_size"),
        (dict(min_hop_size=0.01), "min_hop_size"),
        (dict(windows=("hann_window", "gaussian_window")), "windows"),
        (dict(windows=()), "windows"),
        (dict(scale="mel", sample_rate=16000, n_mels=32), "n_mels"),
        (dict(scale="mel", n_mels=8), "sample_rate"),
        (dict(w_phs=-1.0), "w_phs"),
    ]
    for settings, name in cases:
        with pytest.raises((ValueError, TypeError), match=name):
            rl.RandomResolutionSTFTLoss(**settings)


@pytest.mark.float32
@pytest.mark.parametrize(
    "group, name, case",
    [
        ("options", "everything full", "mono"),
        ("options", "MR options", "batch"),
        ("losses", "SumAndDifferenceSTFTLoss full", "batch"),
        ("losses", "ChromaSTFTLoss", "batch"),
    ],
)
def test_float32_process_matches_auraloss(group, name, case):
    # With x64 off, as users run: float64 NumPy input becomes float32.
    settings = OPTIONS if group == "options" else LOSSES
    if HAVE_AURALOSS:
        entry = [e for e in reference.LOSSES + reference.LOSSES_2 if e[0] == name]
        want = reference.auraloss_values(CASES, entry)["float32"][name][case]
    else:
        want = STORED[group]["float32"][name][case]
    loss = jax.jit(make_retrax(*settings[name]))
    pred, target = CASES[case]
    out = flat(loss(pred, target))
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-6)
    grad = jax.grad(lambda p: first(loss(p, target)))(pred)
    assert grad.dtype == jnp.float32 and np.all(np.isfinite(grad))
