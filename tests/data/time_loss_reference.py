"""Reference values of auraloss's time-domain losses for the tests.

`tests/losses/test_time_losses.py` compares `retrax.losses`' `ESRLoss`, `DCLoss`,
`LogCoshLoss`, `SNRLoss`, `SISDRLoss` and `SDSDRLoss` with auraloss 0.4.0
directly when auraloss is importable, and otherwise with the values this
script stored in `time_loss_reference.json`. Regenerate them with a Python
that has numpy, torch and auraloss installed:

    python tests/data/time_loss_reference.py

The signals come from `signals()` below (seeded numpy, imported by the test
too); the JSON records a fingerprint of each case's samples so that the test
can check that the stored values belong to the same inputs. Gradients (with
respect to the prediction, float64) are stored as fingerprints too.
"""

import json
import pathlib

import numpy as np


SEED = 20261203
LENGTH = 512
SHAPES = {"mono": (LENGTH,), "stereo": (2, LENGTH), "batch": (3, 2, LENGTH)}
PATH = pathlib.Path(__file__).with_name("time_loss_reference.json")

# (name, auraloss class, keyword arguments): the defaults and the options
LOSSES = [
    ("ESRLoss", "ESRLoss", {}),
    ("ESRLoss sum", "ESRLoss", {"reduction": "sum"}),
    ("ESRLoss none", "ESRLoss", {"reduction": "none"}),
    ("DCLoss", "DCLoss", {}),
    ("DCLoss none", "DCLoss", {"reduction": "none"}),
    ("LogCoshLoss", "LogCoshLoss", {}),
    ("LogCoshLoss a=3", "LogCoshLoss", {"a": 3.0, "eps": 1e-6}),
    ("LogCoshLoss none", "LogCoshLoss", {"reduction": "none"}),
    ("SNRLoss", "SNRLoss", {}),
    ("SNRLoss raw", "SNRLoss", {"zero_mean": False}),
    ("SNRLoss none", "SNRLoss", {"reduction": "none"}),
    ("SISDRLoss", "SISDRLoss", {}),
    ("SISDRLoss raw", "SISDRLoss", {"zero_mean": False, "reduction": "sum"}),
    ("SISDRLoss none", "SISDRLoss", {"reduction": "none"}),
    ("SDSDRLoss", "SDSDRLoss", {}),
    ("SDSDRLoss raw", "SDSDRLoss", {"zero_mean": False}),
    ("SDSDRLoss none", "SDSDRLoss", {"reduction": "none"}),
]


def signals() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """`{case: (pred, target)}` in float64: a target of noise with a DC offset
    and a prediction that is a scaled, offset, noisier copy."""
    rng = np.random.default_rng(SEED)
    cases = {}
    for name, shape in SHAPES.items():
        target = 0.5 * rng.standard_normal(shape) + 0.05
        pred = 0.8 * target + 0.2 * rng.standard_normal(shape) - 0.03
        cases[name] = (pred, target)
    return cases


def fingerprint(x: np.ndarray) -> list[float]:
    """A few numbers that change when the values change."""
    flat = np.asarray(x, np.float64).ravel()
    return [float(np.sum(flat)), float(np.sum(flat**2)), *map(float, flat[:3])]


def auraloss_values(cases) -> dict:
    """`{dtype: {loss: {case: value (a list)}}}` and, under `"grad"`, the
    float64 gradients' fingerprints with respect to `pred`."""
    import auraloss
    import torch

    out: dict = {"float32": {}, "float64": {}, "grad": {}}
    for name, cls, kwargs in LOSSES:
        loss = getattr(auraloss.time, cls)(**kwargs)
        for dtype in ("float32", "float64"):
            out[dtype][name] = {}
            for case, (pred, target) in cases.items():
                p = torch.from_numpy(pred.astype(dtype))
                t = torch.from_numpy(target.astype(dtype))
                value = loss(p, t).detach().numpy().astype(np.float64)
                out[dtype][name][case] = value.ravel().tolist()
        out["grad"][name] = {}
        for case, (pred, target) in cases.items():
            p = torch.from_numpy(pred.copy()).requires_grad_(True)
            loss(p, torch.from_numpy(target)).sum().backward()
            out["grad"][name][case] = fingerprint(p.grad.numpy())
    return out


if __name__ == "__main__":
    cases = signals()
    data = {
        "auraloss": "0.4.0",
        "fingerprints": {
            case: {"pred": fingerprint(p), "target": fingerprint(t)}
            for case, (p, t) in cases.items()
        },
        "values": auraloss_values(cases),
    }
    PATH.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {PATH}")
