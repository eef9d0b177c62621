"""Reference values of dasp-pytorch's compressor, stereo bus, widener and
panner for the tests.

`tests/effects/test_dasp.py` compares `retrax.effects.DaspCompressor`,
`retrax.effects.stereo_bus`, `retrax.effects.DaspStereoWidener` and
`retrax.effects.DaspStereoPanner` with dasp-pytorch 0.0.1 directly when it is
importable, and otherwise with the values this script stored in
`dasp_reference.json`. Regenerate them with a Python that has numpy, torch
and dasp-pytorch installed:

    python tests/data/dasp_reference.py

The signals and parameters come from `compressor_cases()`, `bus_cases()` and
`stereo_cases()` below (seeded numpy, imported by the test too): the
compressor's parameters
are drawn uniformly over dasp's `modules.Compressor` ranges (`RANGES`, checked
against dasp's when it is importable), plus both ends of the ranges. The JSON
records a fingerprint of each case's inputs so that the test can check that
the stored values belong to the same inputs; the outputs are stored whole
(float64 and float32), the float64 gradients as fingerprints.
"""

import json
import pathlib

import numpy as np


SEED = 20261204
LENGTH = 512
# the widener and the panner work sample by sample: a few samples suffice
STEREO_LENGTH = 64
PATH = pathlib.Path(__file__).with_name("dasp_reference.json")
# dasp's `modules.Compressor(sample_rate).param_ranges`, in its order
RANGES = {
    "threshold_db": (-60.0, 0.0),
    "ratio": (1.0, 20.0),
    "attack_ms": (5.0, 100.0),
    "release_ms": (5.0, 100.0),
    "knee_db": (0.0, 12.0),
    "makeup_gain_db": (0.0, 12.0),
}
NAMES = list(RANGES)


def _signal(rng, channels: int) -> np.ndarray:
    """Noise under an envelope that falls from 0 dB to -66 dB with bursts,
    so that the level crosses every threshold in the range."""
    t = np.linspace(0.0, 1.0, LENGTH)
    envelope = 10 ** (-3.3 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 7 * t) ** 2)
    return 0.9 * envelope * rng.standard_normal((channels, LENGTH))


def compressor_cases() -> dict[str, dict]:
    """`{case: {"x": (channels, time), "params": {name: value}, "sample_rate",
    "lookahead"}}`, float64."""
    rng = np.random.default_rng(SEED)
    cases = {}
    for k in range(12):
        channels = 1 + k % 2
        params = {n: float(rng.uniform(*RANGES[n])) for n in NAMES}
        cases[f"random {k} ({'stereo' if channels == 2 else 'mono'})"] = {
            "x": _signal(rng, channels),
            "params": params,
            "sample_rate": 16_000.0 if k < 8 else 44_100.0,
            "lookahead": 0 if k < 10 else 37,
        }
    for end, which in (("low ends", 0), ("high ends", 1)):
        for channels in (1, 2):
            cases[f"{end} ({'stereo' if channels == 2 else 'mono'})"] = {
                "x": _signal(rng, channels),
                "params": {n: RANGES[n][which] for n in NAMES},
                "sample_rate": 16_000.0,
                "lookahead": 0,
            }
    return cases


def bus_cases() -> dict[str, dict]:
    """`{case: {"x": (tracks, 2, time), "send_db": (tracks,)}}`, float64."""
    rng = np.random.default_rng(SEED + 1)
    cases = {}
    for tracks in (1, 3, 5):
        cases[f"{tracks} tracks"] = {
            "x": 0.5 * rng.standard_normal((tracks, 2, LENGTH)),
            "send_db": rng.uniform(-30.0, 6.0, tracks),
        }
    return cases


def stereo_cases() -> dict[str, dict]:
    """`{case: {"x": (2, time), "width": value, "mono": (time,), "pan":
    value}}`, float64: widths and pans drawn over [0, 1], and both ends."""
    rng = np.random.default_rng(SEED + 3)
    values = [0.0, 1.0, 0.5, *rng.uniform(0.0, 1.0, 5)]
    cases = {}
    for k, value in enumerate(values):
        cases[f"{k}: {value:.3f}"] = {
            "x": 0.5 * rng.standard_normal((2, STEREO_LENGTH)),
            "width": float(value),
            "mono": 0.5 * rng.standard_normal(STEREO_LENGTH),
            "pan": float(value),
        }
    return cases


def fingerprint(x) -> list[float]:
    """A few numbers that change when the values change."""
    flat = np.asarray(x, np.float64).ravel()
    return [float(np.sum(flat)), float(np.sum(flat**2)), *map(float, flat[:3])]


def weights(shape) -> np.ndarray:
    """The fixed weights `w` of the scalar `sum(w * y)` whose gradient is stored."""
    return np.random.default_rng(SEED + 2).standard_normal(shape)


def _stored(y: np.ndarray) -> list[float]:
    """`y` raveled, with the digits its dtype holds: 9 significant digits
    for float32 (exact), 13 for float64 (within 1e-13 of each value)."""
    digits = 9 if y.dtype == np.float32 else 13
    return [float(f"{v:.{digits}g}") for v in np.ravel(y).tolist()]


def dasp_values(comp_cases, bus, stereo) -> dict:
    """dasp-pytorch's outputs (float32 and float64) and float64 gradients."""
    import dasp_pytorch
    import torch
    from dasp_pytorch.functional import (
        compressor,
        stereo_bus,
        stereo_panner,
        stereo_widener,
    )

    assert dasp_pytorch.Compressor(44_100).param_ranges == RANGES
    out: dict = {"compressor": {}, "bus": {}, "widener": {}, "panner": {}}
    for name, case in comp_cases.items():
        entry: dict = {}
        for dtype in (torch.float32, torch.float64):
            x = torch.tensor(case["x"][None], dtype=dtype, requires_grad=True)
            params = {
                n: torch.tensor([v], dtype=dtype, requires_grad=True)
                for n, v in case["params"].items()
            }
            y = compressor(
                x,
                case["sample_rate"],
                **params,
                lookahead_samples=case["lookahead"],
            )
            key = str(dtype).removeprefix("torch.")
            entry[key] = _stored(y[0].detach().numpy())
            if dtype == torch.float64:
                w = torch.from_numpy(weights(tuple(y.shape[1:])))
                (y[0] * w).sum().backward()
                # dasp never uses `release_ms`: no gradient reaches it (0)
                entry["grad"] = {
                    n: 0.0 if p.grad is None else float(p.grad)
                    for n, p in params.items()
                }
                entry["grad"]["x"] = fingerprint(x.grad[0].numpy())
        out["compressor"][name] = entry
    for name, case in bus.items():
        entry = {}
        for dtype in (torch.float32, torch.float64):
            # dasp's layout: (batch, 2, tracks, time) and (batch, tracks, 1)
            x = torch.tensor(case["x"].transpose(1, 0, 2)[None], dtype=dtype)
            send = torch.tensor(case["send_db"][None, :, None], dtype=dtype)
            y = stereo_bus(x, 44_100, send)
            key = str(dtype).removeprefix("torch.")
            entry[key] = _stored(y[0].numpy())
        out["bus"][name] = entry
    for name, case in stereo.items():
        widener, panner = {}, {}
        for dtype in (torch.float32, torch.float64):
            key = str(dtype).removeprefix("torch.")
            x = torch.tensor(case["x"][None], dtype=dtype)
            width = torch.tensor([case["width"]], dtype=dtype)
            widener[key] = _stored(stereo_widener(x, 44_100, width)[0].numpy())
            # one track: (batch, tracks, time) -> (batch, 2, tracks, time)
            mono = torch.tensor(case["mono"][None, None], dtype=dtype)
            pan = torch.tensor([case["pan"]], dtype=dtype)
            panner[key] = _stored(stereo_panner(mono, 44_100, pan)[0, :, 0].numpy())
        out["widener"][name], out["panner"][name] = widener, panner
    return out


def input_fingerprints(comp_cases, bus, stereo) -> dict:
    """The inputs' fingerprints, by case."""
    return {
        "compressor": {
            name: fingerprint(case["x"]) + [case["params"][n] for n in NAMES]
            for name, case in comp_cases.items()
        },
        "bus": {
            name: fingerprint(case["x"]) + fingerprint(case["send_db"])
            for name, case in bus.items()
        },
        "stereo": {
            name: fingerprint(case["x"]) + fingerprint(case["mono"]) + [case["pan"]]
            for name, case in stereo.items()
        },
    }


if __name__ == "__main__":
    comp_cases, bus, stereo = compressor_cases(), bus_cases(), stereo_cases()
    data = {
        "dasp-pytorch": "0.0.1",
        "fingerprints": input_fingerprints(comp_cases, bus, stereo),
        "values": dasp_values(comp_cases, bus, stereo),
    }
    PATH.write_text(json.dumps(data) + "\n")
    print(f"wrote {PATH}")
