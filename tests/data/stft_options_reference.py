"""Reference values of auraloss's STFT options and its other STFT losses for
the tests.

`tests/losses/test_stft_options.py` compares `retrax.losses`' `STFTLoss` and
`MultiResolutionSTFTLoss` with auraloss 0.4.0's options (`w_phs`,
`scale_invariance`, `perceptual_weighting`, mel and chroma `scale`,
`output="full"`, the Kaiser window) and its `SumAndDifferenceSTFTLoss`,
`MelSTFTLoss`, `ChromaSTFTLoss` and `RandomResolutionSTFTLoss`, directly when
auraloss is importable and otherwise with the values this script stored in
`stft_options_reference.json`. Regenerate them with a Python that has numpy,
torch, auraloss and librosa installed:

    python tests/data/stft_options_reference.py

The signals come from `signals()` below (seeded numpy, imported by the test
too); the JSON records fingerprints of each case's samples so that the test
can check that the stored values belong to the same inputs. Gradients (with
respect to the prediction, float64) are stored as fingerprints too.

Two adjustments make auraloss computable and its float64 values exact:

- auraloss 0.4.0's chroma scale registers librosa's NumPy filterbank as a
  buffer, which torch refuses (`TypeError`); `_chroma_as_tensor` hands it the
  same filterbank as a tensor, which is what that code means to compute.
- In float64 the windows and filterbanks are rebuilt in float64 (auraloss
  makes them in float32, `.double()` would only widen the rounded values);
  the A-weighting taps stay the float32 values auraloss stores.
"""

import contextlib
import json
import pathlib

import numpy as np


SEED = 20261204
LENGTH = 1024
SAMPLE_RATE = 16000
SHAPES = {
    "mono": (1, 1, LENGTH),
    "stereo": (1, 2, LENGTH),
    "batch": (2, 2, LENGTH),
}
PATH = pathlib.Path(__file__).with_name("stft_options_reference.json")

_SMALL = dict(fft_size=256, hop_size=64, win_length=200)
_MR = dict(fft_sizes=[256, 128, 64], hop_sizes=[64, 32, 16], win_lengths=[200, 128, 48])
# The phase term compares angles; where a frame is symmetric about its centre
# (the first frame, reflected, under a window centred on the same sample:
# `win_length` of the parity of `fft_size`) the STFT is real up to rounding
# and the angle of a negative bin is +pi or -pi by the sign of that rounding,
# which differs between FFTs (and between torch's float32 and float64). The
# phase cases use odd windows in even FFTs, whose frames are not symmetric.
_ODD = dict(fft_size=256, hop_size=64, win_length=201)
_MR_ODD = dict(
    fft_sizes=[256, 128, 64], hop_sizes=[64, 32, 16], win_lengths=[201, 127, 47]
)

# (name, auraloss class, keyword arguments, cases). retrax's class of the same
# name takes the same keywords.
LOSSES = [
    ("phase", "STFTLoss", dict(_ODD, w_phs=0.5), ("mono", "stereo", "batch")),
    (
        "phase only L2 sum",
        "STFTLoss",
        dict(
            _ODD,
            w_sc=0.0,
            w_log_mag=0.0,
            w_phs=1.0,
            w_lin_mag=0.3,
            reduction="sum",
            mag_distance="L2",
        ),
        ("stereo",),
    ),
    (
        "scale invariance",
        "STFTLoss",
        dict(_SMALL, scale_invariance=True, w_lin_mag=1.0),
        ("mono",),
    ),
    (
        "A-weighting",
        "STFTLoss",
        dict(_SMALL, perceptual_weighting=True, sample_rate=SAMPLE_RATE),
        ("mono", "stereo", "batch"),
    ),
    (
        "mel",
        "STFTLoss",
        dict(_SMALL, scale="mel", n_bins=32, sample_rate=SAMPLE_RATE, w_lin_mag=0.5),
        ("mono", "batch"),
    ),
    (
        "chroma",
        "STFTLoss",
        dict(_SMALL, scale="chroma", n_bins=12, sample_rate=SAMPLE_RATE),
        ("mono", "batch"),
    ),
    ("kaiser", "STFTLoss", dict(_SMALL, window="kaiser_window"), ("stereo",)),
    (
        "everything full",
        "STFTLoss",
        dict(
            _ODD,
            w_lin_mag=0.2,
            w_phs=0.1,
            scale="mel",
            n_bins=24,
            sample_rate=SAMPLE_RATE,
            perceptual_weighting=True,
            scale_invariance=True,
            output="full",
        ),
        ("mono",),
    ),
    (
        "MR options",
        "MultiResolutionSTFTLoss",
        dict(_MR_ODD, w_phs=0.3, perceptual_weighting=True, sample_rate=SAMPLE_RATE),
        ("mono", "batch"),
    ),
    (
        "MR mel full",
        "MultiResolutionSTFTLoss",
        dict(
            _MR,
            scale="mel",
            n_bins=16,
            sample_rate=SAMPLE_RATE,
            w_lin_mag=1.0,
            output="full",
        ),
        ("stereo",),
    ),
    (
        "MR chroma invariant",
        "MultiResolutionSTFTLoss",
        dict(
            _MR,
            scale="chroma",
            n_bins=12,
            sample_rate=SAMPLE_RATE,
            scale_invariance=True,
        ),
        ("mono",),
    ),
]

# The second group: auraloss's other STFT losses.
LOSSES_2 = [
    (
        "MelSTFTLoss",
        "MelSTFTLoss",
        dict(SAMPLE_RATE=None, **_SMALL, n_mels=40),
        ("mono", "batch"),
    ),
    (
        "MelSTFTLoss options",
        "MelSTFTLoss",
        dict(
            SAMPLE_RATE=None,
            **_ODD,
            n_mels=20,
            w_phs=0.2,
            w_lin_mag=0.5,
            perceptual_weighting=True,
        ),
        ("stereo",),
    ),
    (
        "ChromaSTFTLoss",
        "ChromaSTFTLoss",
        dict(SAMPLE_RATE=None, **_SMALL),
        ("mono", "batch"),
    ),
    (
        "ChromaSTFTLoss 24",
        "ChromaSTFTLoss",
        dict(SAMPLE_RATE=None, **_SMALL, n_chroma=24, w_lin_mag=1.0),
        ("stereo",),
    ),
    (
        "SumAndDifferenceSTFTLoss",
        "SumAndDifferenceSTFTLoss",
        dict(_MR),
        ("stereo", "batch"),
    ),
    (
        "SumAndDifferenceSTFTLoss full",
        "SumAndDifferenceSTFTLoss",
        dict(
            _MR,
            w_sum=0.7,
            w_diff=1.5,
            output="full",
            w_lin_mag=0.5,
            perceptual_weighting=True,
            sample_rate=SAMPLE_RATE,
        ),
        ("batch",),
    ),
    (
        "SumAndDifferenceSTFTLoss mel",
        "SumAndDifferenceSTFTLoss",
        dict(_MR, scale="mel", n_bins=16, sample_rate=SAMPLE_RATE),
        ("stereo",),
    ),
    ("RandomResolutionSTFTLoss", "RandomResolutionSTFTLoss", dict(), ("mono", "batch")),
    (
        "RandomResolutionSTFTLoss mel",
        "RandomResolutionSTFTLoss",
        dict(scale="mel", n_mels=8, sample_rate=SAMPLE_RATE, w_lin_mag=0.5),
        ("stereo",),
    ),
]

# The resolutions `RandomResolutionSTFTLoss` is evaluated at (auraloss draws
# them from numpy's global generator): (fft_size, hop_size, win_length,
# window), as its sampling can give them with min_fft_size=16,
# max_fft_size=512.
RANDOM_SETTINGS = dict(min_fft_size=16, max_fft_size=512)
RANDOM_RESOLUTIONS = [
    (256, 230, 64, "kaiser_window"),
    (32, 5, 32, "blackman_window"),
    (128, 70, 64, "hamming_window"),
]


def _with_sample_rate(kwargs: dict) -> dict:
    """`SAMPLE_RATE=None` marks the positional sample rate of the mel and
    chroma losses."""
    kwargs = dict(kwargs)
    if "SAMPLE_RATE" in kwargs:
        del kwargs["SAMPLE_RATE"]
        kwargs["sample_rate"] = SAMPLE_RATE
    return kwargs


def retrax_kwargs(kwargs: dict) -> dict:
    """The keywords as retrax's class of the same name takes them (the same
    names; tuples for lists)."""
    return {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in _with_sample_rate(kwargs).items()
    }


def signals() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`{case: (pred, target)}` in float64, `(batch, channels, time)`: a
    target of decaying noise plus a tone and a prediction that is a scaled,
    noisier copy."""
    rng = np.random.default_rng(SEED)
    cases = {}
    t = np.arange(LENGTH)
    for name, shape in SHAPES.items():
        envelope = np.exp(-t / 500.0)
        tone = 0.3 * np.sin(2 * np.pi * 440 * t / SAMPLE_RATE)
        target = rng.standard_normal(shape) * envelope + tone
        pred = 0.8 * target + 0.1 * rng.standard_normal(shape)
        cases[name] = (pred, target)
    return cases


def fingerprint(x: np.ndarray) -> list[float]:
    """A few numbers that change when the values change."""
    flat = np.asarray(x, np.float64).ravel()
    ramp = np.sin(np.arange(flat.size) * 0.37)
    return [
        float(np.sum(flat)),
        float(np.sum(flat**2)),
        float(np.sum(flat * ramp)),
        *map(float, flat[:3]),
    ]


@contextlib.contextmanager
def _chroma_as_tensor():
    import librosa.filters
    import torch

    original = librosa.filters.chroma
    librosa.filters.chroma = lambda **kw: torch.tensor(original(**kw))
    try:
        yield
    finally:
        librosa.filters.chroma = original


def _to_float64(loss):
    """`loss.double()` with float64 windows and filterbanks."""
    import auraloss
    import librosa
    import torch

    loss = loss.double()
    for m in loss.modules():
        if isinstance(m, auraloss.freq.STFTLoss):
            m.window = getattr(torch, m.window_name)(m.win_length, dtype=torch.float64)
            if m.scale == "mel":
                fb = librosa.filters.mel(
                    sr=m.sample_rate,
                    n_fft=m.fft_size,
                    n_mels=m.n_bins,
                    dtype=np.float64,
                )
                m.fb = torch.tensor(fb).unsqueeze(0)
            elif m.scale == "chroma":
                fb = librosa.filters.chroma(
                    sr=m.sample_rate,
                    n_fft=m.fft_size,
                    n_chroma=m.n_bins,
                    dtype=np.float64,
                )
                m.fb = torch.tensor(fb)
    return loss


def make_auraloss(cls: str, kwargs: dict):
    """auraloss's loss `cls` with `kwargs` (the chroma filterbank as a
    tensor; `RandomResolutionSTFTLoss` fixed at `RANDOM_RESOLUTIONS`). Each
    `STFTLoss` remembers its window's name as `window_name`."""
    import auraloss
    import torch

    kwargs = _with_sample_rate(kwargs)
    with _chroma_as_tensor():
        if cls == "RandomResolutionSTFTLoss":
            loss = auraloss.freq.RandomResolutionSTFTLoss(**RANDOM_SETTINGS, **kwargs)
            loss.stft_losses = torch.nn.ModuleList()
            for fft, hop, win, window in RANDOM_RESOLUTIONS:
                loss.stft_losses.append(
                    auraloss.freq.STFTLoss(
                        fft,
                        hop,
                        win,
                        window,
                        loss.w_sc,
                        loss.w_log_mag,
                        loss.w_lin_mag,
                        loss.w_phs,
                        loss.sample_rate,
                        loss.scale,
                        loss.n_mels,
                    )
                )
                loss.stft_losses[-1].window_name = window
            loss.nforwards, loss.randomize_rate = 1, 2**62  # never redraw
            return loss
        loss = getattr(auraloss.freq, cls)(**kwargs)
    window = kwargs.get("window", "hann_window")
    for m in loss.modules():
        if isinstance(m, auraloss.freq.STFTLoss):
            m.window_name = window
    return loss


def _flatten(out) -> list[float]:
    """The loss, or the loss and its terms (a term that is a list of one per
    resolution is flattened in order)."""
    if not isinstance(out, tuple):
        return [float(out)]
    flat = []
    for term in out:
        flat.extend(float(t) for t in term) if isinstance(term, list) else flat.append(
            float(term)
        )
    return flat


def auraloss_values(cases, losses) -> dict:
    """`{dtype: {loss: {case: values}}}` and, under `"grad"`, fingerprints of
    the float64 gradients of the loss with respect to `pred`."""
    import torch

    out: dict = {"float32": {}, "float64": {}, "grad": {}}
    for name, cls, kwargs, names in losses:
        for dtype in ("float32", "float64"):
            loss = make_auraloss(cls, kwargs)
            if dtype == "float64":
                loss = _to_float64(loss)
            out[dtype][name] = {}
            for case in names:
                pred, target = cases[case]
                p = torch.tensor(pred.astype(dtype), requires_grad=True)
                t = torch.tensor(target.astype(dtype))
                value = loss(p, t)
                out[dtype][name][case] = _flatten(value)
                if dtype == "float64":
                    first = value[0] if isinstance(value, tuple) else value
                    (grad,) = torch.autograd.grad(first, p)
                    out["grad"].setdefault(name, {})[case] = fingerprint(grad.numpy())
    return out


def librosa_chroma_filterbanks() -> list:
    """`librosa.filters.chroma` at `CHROMA_SETTINGS`, in float64."""
    import librosa

    return [
        librosa.filters.chroma(**settings, dtype=np.float64).tolist()
        for settings in CHROMA_SETTINGS
    ]


CHROMA_SETTINGS = [
    dict(sr=22050, n_fft=64, n_chroma=12),
    dict(
        sr=16000,
        n_fft=48,
        n_chroma=24,
        tuning=0.3,
        ctroct=4.0,
        octwidth=None,
        base_c=False,
    ),
]


def main() -> None:
    import importlib.metadata

    import torch

    cases = signals()
    record = {
        "auraloss": importlib.metadata.version("auraloss"),
        "torch": torch.__version__,
        "librosa": importlib.metadata.version("librosa"),
        "seed": SEED,
        "fingerprints": {
            name: {"pred": fingerprint(p), "target": fingerprint(t)}
            for name, (p, t) in cases.items()
        },
        "options": auraloss_values(cases, LOSSES),
        "losses": auraloss_values(cases, LOSSES_2),
        "chroma_filterbanks": librosa_chroma_filterbanks(),
    }
    PATH.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
