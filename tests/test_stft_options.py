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


DATA = pathlib.Path(__file__).parent / "data"
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


def make_retrax(cls, kwargs):
    return getattr(rl, cls)(**reference.retrax_kwargs(kwargs))


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
