"""Reference values of dasp-pytorch's compressor, stereo bus, widener and
panner, and of its processors' `process_normalized` on normalised parameter
vectors, for the tests.

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
against dasp's when it is importable), plus both ends of the ranges. The
vector cases (`vector_cases()`, `dasp_vector_values()`) are 32 vectors per
effect drawn uniformly over [0, 1], each on a mono and a stereo signal of
64 samples, through dasp's `process_normalized` (the panner's and widener's
functions, which have no module); the reverb's white noise is drawn here
(`reverb_noise()`) and handed to dasp in place of its `torch.randn`, so the
test can pass the same noise to retrax. The JSON
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


# dasp's normalised vectors: 32 per effect, each on a mono and a stereo
# signal (the panner: one track and two), 64 samples at 44.1 kHz
VECTOR_EFFECTS = {
    "gain": 1,
    "distortion": 1,
    "parametric_eq": 18,
    "compressor": 6,
    "reverb": 25,
    "panner": 1,
    "widener": 1,
}
N_VECTORS = 32
VECTOR_LENGTH = 64
VECTOR_RATE = 44_100
# dasp's reverb defaults: the response's length and the band filters' taps
REVERB_LENGTH, REVERB_TAPS = 65_536, 1_023


def vector_cases() -> dict[str, dict]:
    """`{effect: {"p": (32, P), "mono": (1, T), "stereo": (2, T)}}`, float64:
    dasp's normalised vectors drawn uniformly over [0, 1] and two signals
    under a falling envelope (so that the compressor's level crosses its
    thresholds)."""
    rng = np.random.default_rng(SEED + 4)
    t = np.linspace(0.0, 1.0, VECTOR_LENGTH)
    envelope = 10 ** (-3.3 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t) ** 2)
    cases = {}
    for name, size in VECTOR_EFFECTS.items():
        cases[name] = {
            "p": rng.uniform(0.0, 1.0, (N_VECTORS, size)),
            "mono": 0.9 * envelope * rng.standard_normal((1, VECTOR_LENGTH)),
            "stereo": 0.9 * envelope * rng.standard_normal((2, VECTOR_LENGTH)),
        }
    return cases


def reverb_noise() -> np.ndarray:
    """The white noise `(2, 12, 65536 + 1022)` of every reverb case, as
    torch's `randn` returns it to dasp (float32): dasp draws it inside
    `noise_shaped_reverberation`; the script hands it this draw instead."""
    rng = np.random.default_rng(SEED + 5)
    shape = (2, 12, REVERB_LENGTH + REVERB_TAPS - 1)
    return rng.standard_normal(shape).astype(np.float32)


def _dasp_vector_call(name: str, x, p, dtype):
    """dasp's output for one signal `x` `(channels, T)` and one vector `p`
    `(P,)` (torch tensors of `dtype`), as `(channels_out, T)`."""
    import dasp_pytorch
    from dasp_pytorch.functional import distortion, stereo_panner, stereo_widener

    rate = VECTOR_RATE
    if name == "distortion":
        # dasp 0.0.1's `Distortion.process_normalized` fails (it reads a
        # `sample_rate` the module lacks and passes `gain_db` to a function
        # that takes `drive_db`): its denormalisation, then its function;
        # which reshapes the drive to one value per channel, so takes mono
        # only: each channel is one mono example
        low, high = dasp_pytorch.Distortion().param_ranges["gain_db"]
        drive = p * (high - low) + low
        return distortion(x[:, None], rate, drive.repeat(x.shape[0]))[:, 0]
    if name == "panner":
        # one value of `pan` per track; output (1, 2, tracks, T)
        pan = p.repeat(x.shape[0])[None]
        return stereo_panner(x[None], rate, pan)[0].transpose(0, 1)
    if name == "widener":
        stereo = x if x.shape[0] == 2 else x.repeat(2, 1)
        return stereo_widener(stereo[None], rate, p)[0]
    module = {
        "gain": dasp_pytorch.Gain,
        "parametric_eq": dasp_pytorch.ParametricEQ,
        "compressor": dasp_pytorch.Compressor,
        "reverb": dasp_pytorch.NoiseShapedReverb,
    }[name](rate)
    return module.process_normalized(x[None], p[None])[0]


def dasp_vector_values(cases) -> dict:
    """dasp's `process_normalized` outputs (float32 and float64) for every
    vector of `vector_cases()`, by effect: `{"float32": [...], "float64":
    [...]}`, each entry one case raveled, mono then stereo for each vector
    (the panner's "stereo" is two tracks, `(tracks, 2, T)` raveled)."""
    from unittest import mock

    import torch

    noise = torch.from_numpy(reverb_noise())
    conv1d = torch.nn.functional.conv1d
    filtered: dict = {}

    def noise_filter_once(x, w, *args, **kwargs):
        # dasp filters the same noise with the same bank at every call: the
        # first result, by dtype, stands for the others (1.6e9 products each)
        if kwargs.get("groups") != w.shape[0] or x.shape[1] != w.shape[0]:
            return conv1d(x, w, *args, **kwargs)
        if x.dtype not in filtered:
            filtered[x.dtype] = conv1d(x, w, *args, **kwargs)
        return filtered[x.dtype].clone()

    out: dict = {}
    for name, case in cases.items():
        entry: dict = {"float32": [], "float64": []}
        for dtype in (torch.float32, torch.float64):
            key = str(dtype).removeprefix("torch.")
            for p in case["p"]:
                for layout in ("mono", "stereo"):
                    x = torch.tensor(case[layout], dtype=dtype)
                    pt = torch.tensor(p, dtype=dtype)
                    # torch.randn gives float32; dasp casts it to x's dtype
                    with (
                        mock.patch.object(torch, "randn", lambda *a: noise.clone()),
                        mock.patch.object(
                            torch.nn.functional, "conv1d", noise_filter_once
                        ),
                    ):
                        y = _dasp_vector_call(name, x, pt, dtype)
                    entry[key].append(_stored(y.numpy()))
        out[name] = entry
    return out


def dasp_vector_ranges() -> dict:
    """dasp's parameter names and ranges in its order, by effect: its
    modules' `param_ranges` at 44.1 kHz (the panner's and widener's
    functions take their one parameter in [0, 1] and have no module)."""
    import dasp_pytorch

    modules = {
        "gain": dasp_pytorch.Gain(VECTOR_RATE),
        "distortion": dasp_pytorch.Distortion(),
        "parametric_eq": dasp_pytorch.ParametricEQ(VECTOR_RATE),
        "compressor": dasp_pytorch.Compressor(VECTOR_RATE),
        "reverb": dasp_pytorch.NoiseShapedReverb(VECTOR_RATE),
    }
    ranges = {
        name: {n: [float(lo), float(hi)] for n, (lo, hi) in m.param_ranges.items()}
        for name, m in modules.items()
    }
    return ranges | {"panner": {"pan": [0.0, 1.0]}, "widener": {"width": [0.0, 1.0]}}


def vector_fingerprints(cases) -> dict:
    """The vector cases' fingerprints, by effect (and the reverb's noise)."""
    prints = {
        name: fingerprint(case["p"])
        + fingerprint(case["mono"])
        + fingerprint(case["stereo"])
        for name, case in cases.items()
    }
    prints["reverb noise"] = fingerprint(reverb_noise())
    return prints


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
    vectors = vector_cases()
    data = {
        "dasp-pytorch": "0.0.1",
        "fingerprints": input_fingerprints(comp_cases, bus, stereo),
        "values": dasp_values(comp_cases, bus, stereo),
        "vector fingerprints": vector_fingerprints(vectors),
        "vectors": dasp_vector_values(vectors),
        "vector ranges": dasp_vector_ranges(),
    }
    PATH.write_text(json.dumps(data) + "\n")
    print(f"wrote {PATH}")
