"""Reference values of auraloss's `MultiResolutionSTFTLoss` (and librosa's mel
filterbank) for the tests.

`tests/losses/test_stft_losses.py` compares `retrax.losses.MultiResolutionSTFTLoss` with
auraloss directly when auraloss is importable, and otherwise with the values
this script stored in `stft_loss_reference.json`; likewise for
`librosa.filters.mel`. Regenerate them with a Python that has numpy, torch,
auraloss and librosa installed:

    python tests/data/stft_loss_reference.py

The signals come from `signals()` below (seeded numpy, imported by the test
too); the JSON records each case's shape and a fingerprint of its samples so
that the test can check that the stored values belong to the same inputs.
"""

import json
import pathlib

import numpy as np


SEED = 20261201
LENGTH = 2048  # the largest default FFT size: the shortest signal that fits
SHAPES = {"mono": (LENGTH,), "stereo": (2, LENGTH), "batch": (3, 2, LENGTH)}
PATH = pathlib.Path(__file__).with_name("stft_loss_reference.json")


def signals() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`{case: (pred, target)}` in float64: a target of white noise with a
    decaying envelope and a prediction that is a scaled, noisier copy."""
    rng = np.random.default_rng(SEED)
    cases = {}
    for name, shape in SHAPES.items():
        envelope = np.exp(-np.arange(shape[-1]) / 700.0)
        target = rng.standard_normal(shape) * envelope
        pred = 0.8 * target + 0.1 * rng.standard_normal(shape)
        cases[name] = (pred, target)
    return cases


def fingerprint(x: np.ndarray) -> list[float]:
    """A few numbers that change when the samples change."""
    flat = np.asarray(x, np.float64).ravel()
    return [float(np.sum(flat)), float(np.sum(flat**2)), *map(float, flat[:3])]


def auraloss_values(cases, dtype: str) -> dict[str, float]:
    """auraloss's default `MultiResolutionSTFTLoss` of every case, computed in
    `dtype` ("float32" or "float64"); auraloss takes `(batch, channels, time)`
    only, so lower ranks are given as one batch of one example."""
    import auraloss
    import torch

    loss = auraloss.freq.MultiResolutionSTFTLoss()
    out = {}
    for name, (pred, target) in cases.items():
        shape = (1,) * (3 - pred.ndim) + pred.shape
        p = torch.from_numpy(pred.astype(dtype).reshape(shape))
        t = torch.from_numpy(target.astype(dtype).reshape(shape))
        if dtype == "float64":
            loss = loss.double()
            for r in loss.stft_losses:  # a float64 window, not a cast float32 one
                r.window = torch.hann_window(r.win_length, dtype=torch.float64)
        out[name] = float(loss(p, t))
    return out


MEL_SETTINGS = [
    dict(sr=16000, n_fft=64, n_mels=8, fmin=0.0, fmax=None),
    dict(sr=44100, n_fft=128, n_mels=10, fmin=50.0, fmax=12000.0),
]


def librosa_mel_filterbanks() -> list[list[list[float]]]:
    """`librosa.filters.mel` at `MEL_SETTINGS`, in float64."""
    import librosa

    return [
        librosa.filters.mel(**settings, dtype=np.float64).tolist()
        for settings in MEL_SETTINGS
    ]


def main() -> None:
    import importlib.metadata

    import torch

    cases = signals()
    record = {
        "auraloss": importlib.metadata.version("auraloss"),
        "torch": torch.__version__,
        "seed": SEED,
        "cases": {
            name: {
                "shape": list(pred.shape),
                "pred_fingerprint": fingerprint(pred),
                "target_fingerprint": fingerprint(target),
            }
            for name, (pred, target) in cases.items()
        },
    }
    for dtype in ("float32", "float64"):
        for name, value in auraloss_values(cases, dtype).items():
            record["cases"][name][dtype] = value
    record["librosa"] = importlib.metadata.version("librosa")
    record["mel_filterbanks"] = librosa_mel_filterbanks()
    PATH.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
