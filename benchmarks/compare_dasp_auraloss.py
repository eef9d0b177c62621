"""The measured differences of docs/coming-from-dasp-auraloss.md.

Two steps, because the peers and retrax may live in different environments:

1. `python benchmarks/compare_dasp_auraloss.py peers OUT.npz` with a python
   that has torch, dasp-pytorch 0.0.1, auraloss 0.4.0 and librosa: draws the
   signals and parameters and stores them with the peers' outputs, losses and
   float64 gradients.
2. `PYTHONPATH=src python benchmarks/compare_dasp_auraloss.py retrax OUT.npz`:
   computes retrax's on the same inputs and prints the largest differences
   relative to max |peer| (losses: relative to the loss).

Signals: 4 examples of one second at 44.1 kHz (harmonic tones under a slow
envelope, as `bench_effects.py`), mono and stereo; dasp's compressor
parameters uniform over its ranges; the losses' target is the stereo
prediction with noise (0.1) scaled by 0.8; the float64 gradients on the first
8,192 samples of the first example. In float64 auraloss's windows and mel
filterbank are rebuilt in float64 (`loss.double()` casts the float32 ones,
which moves the gradients by about 1e-4 relative).
"""

import sys

import numpy as np


SR = 44_100
B, N = 4, 44_100
COMPRESSOR_RANGES = {
    "threshold_db": (-60, 0),
    "ratio": (1, 20),
    "attack_ms": (5, 100),
    "release_ms": (5, 100),
    "knee_db": (0, 12),
    "makeup_gain_db": (0, 12),
}
# retrax's own Compressor's settings, and dasp's at the same (a near-hard knee)
NORMAL = {"threshold_db": -20.0, "ratio": 4.0, "attack_ms": 10.0}
NORMAL_RELEASE_MS = 100.0
LOSSES = (
    "ESR",
    "DC",
    "LogCosh",
    "SNR",
    "SISDR",
    "SDSDR",
    "STFT",
    "MRSTFT",
    "MRSTFT perceptual",
    "MelSTFT",
    "SumAndDifference",
)
RESOLUTIONS = ([1024, 2048, 512], [120, 240, 50], [600, 1200, 240])


def signals(rng, channels):
    t = np.arange(N) / SR
    shape = (B, channels, 1)
    f0 = rng.uniform(80, 220, shape)
    tone = sum(
        np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 2 * np.pi, shape)) / k
        for k in range(1, 9)
    )
    envelope = 0.1 + 0.9 * np.abs(np.sin(2 * np.pi * rng.uniform(1, 3, shape) * t))
    return 0.3 * envelope * tone + 1e-3 * rng.standard_normal((B, channels, N))


def inputs():
    rng = np.random.default_rng(0)
    d = {"mono": signals(rng, 1), "stereo": signals(rng, 2)}
    for k, (lo, hi) in COMPRESSOR_RANGES.items():
        d["comp_" + k] = rng.uniform(lo, hi, B)
    d["width"] = rng.uniform(0, 1, B)
    d["pan"] = rng.uniform(0, 1, B)
    d["tracks"] = rng.standard_normal((B, 2, 3, 4096))  # dasp's (B, 2, tracks, T)
    d["sends"] = rng.uniform(-24, 6, (B, 3, 1))
    d["pred"] = d["stereo"]
    d["target"] = 0.8 * (d["stereo"] + 0.1 * rng.standard_normal(d["stereo"].shape))
    return d


def auraloss_loss(name):
    import auraloss

    t, f = auraloss.time, auraloss.freq
    return {
        "ESR": t.ESRLoss,
        "DC": t.DCLoss,
        "LogCosh": t.LogCoshLoss,
        "SNR": t.SNRLoss,
        "SISDR": t.SISDRLoss,
        "SDSDR": t.SDSDRLoss,
        "STFT": f.STFTLoss,
        "MRSTFT": f.MultiResolutionSTFTLoss,
        "MRSTFT perceptual": lambda: f.MultiResolutionSTFTLoss(
            perceptual_weighting=True, sample_rate=SR
        ),
        "MelSTFT": lambda: f.MelSTFTLoss(SR, n_mels=128),
        "SumAndDifference": lambda: f.SumAndDifferenceSTFTLoss(*RESOLUTIONS),
    }[name]()


def retrax_loss(name):
    import retrax.losses as rl

    return {
        "ESR": rl.ESRLoss,
        "DC": rl.DCLoss,
        "LogCosh": rl.LogCoshLoss,
        "SNR": rl.SNRLoss,
        "SISDR": rl.SISDRLoss,
        "SDSDR": rl.SDSDRLoss,
        "STFT": rl.STFTLoss,
        "MRSTFT": rl.MultiResolutionSTFTLoss,
        "MRSTFT perceptual": lambda: rl.MultiResolutionSTFTLoss(
            perceptual_weighting=True, sample_rate=SR
        ),
        "MelSTFT": lambda: rl.MelSTFTLoss(SR, n_mels=128),
        "SumAndDifference": lambda: rl.SumAndDifferenceSTFTLoss(*RESOLUTIONS),
    }[name]()


def float64_auraloss(loss):
    """`loss.double()` with float64 windows and mel filterbanks."""
    import auraloss
    import librosa
    import torch

    loss = loss.double()
    for m in loss.modules():
        if isinstance(m, auraloss.freq.STFTLoss):
            m.window = torch.hann_window(m.win_length, dtype=torch.float64)
            if m.scale == "mel":
                fb = librosa.filters.mel(
                    sr=m.sample_rate,
                    n_fft=m.fft_size,
                    n_mels=m.n_bins,
                    dtype=np.float64,
                )
                m.fb = torch.tensor(fb).unsqueeze(0)
    return loss


def peers(path):
    import dasp_pytorch.functional as F
    import torch

    d = inputs()
    out = dict(d)
    params = {k: d["comp_" + k] for k in COMPRESSOR_RANGES}
    for name in ("mono", "stereo"):
        for bits, dtype in (("32", torch.float32), ("64", torch.float64)):
            p = {k: torch.tensor(v, dtype=dtype) for k, v in params.items()}
            y = F.compressor(torch.tensor(d[name], dtype=dtype), SR, **p)
            out[f"comp_{name}_{bits}"] = y.numpy()
        normal = NORMAL | {
            "release_ms": NORMAL_RELEASE_MS,
            "knee_db": 1e-3,
            "makeup_gain_db": 0.0,
        }
        p = {k: torch.full((B,), v, dtype=torch.float64) for k, v in normal.items()}
        out[f"normal_{name}"] = F.compressor(torch.tensor(d[name]), SR, **p).numpy()
    f32 = lambda k: torch.tensor(d[k], dtype=torch.float32)  # noqa: E731
    out["widener"] = F.stereo_widener(f32("stereo"), SR, f32("width").view(-1, 1))
    out["panner"] = F.stereo_panner(f32("mono"), SR, f32("pan"))[:, :, 0]
    out["bus"] = F.stereo_bus(f32("tracks"), SR, f32("sends"))
    for name in LOSSES:
        value = auraloss_loss(name)(f32("pred"), f32("target"))
        out[f"loss32_{name}"] = np.asarray(float(value))
        pred = torch.tensor(d["pred"][:1, :, :8192], requires_grad=True)
        value = float64_auraloss(auraloss_loss(name))(
            pred, torch.tensor(d["target"][:1, :, :8192])
        )
        value.backward()
        out[f"loss64_{name}"] = np.asarray(float(value.detach()))
        out[f"grad64_{name}"] = pred.grad.numpy()
    out = {k: np.asarray(v) for k, v in out.items()}
    np.savez(path, **out)


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def ours(path):
    import jax

    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp

    import retrax.effects as fx

    d = np.load(path)
    mine = inputs()
    for k, v in mine.items():  # the same draws as the stored ones
        np.testing.assert_array_equal(v, d[k], err_msg=k)

    def compressor(p, x):
        # dasp's `makeup_gain_db` is retrax's `makeup_db`
        p = {("makeup_db" if k == "makeup_gain_db" else k): v for k, v in p.items()}
        return fx.DaspCompressor(**p, sample_rate=SR)(x if x.shape[0] == 2 else x[0])

    for name in ("mono", "stereo"):
        ref = {bits: d[f"comp_{name}_{bits}"] for bits in ("32", "64")}
        for dtype in (jnp.float32, jnp.float64):
            p = {k: jnp.asarray(d["comp_" + k], dtype) for k in COMPRESSOR_RANGES}
            y = jax.jit(jax.vmap(compressor))(p, jnp.asarray(d[name], dtype))
            y = np.asarray(y).reshape(ref["64"].shape)
            print(
                f"DaspCompressor {name} {jnp.dtype(dtype).name}: "
                f"{_rel(y, ref['64']):.1e} of dasp float64, "
                f"{_rel(y, ref['32']):.1e} of dasp float32"
            )
        print(
            f"dasp float32 against dasp float64, {name}: "
            f"{_rel(ref['32'], ref['64']):.1e}"
        )
        own = fx.Compressor(
            **NORMAL, release_ms=NORMAL_RELEASE_MS, makeup_db=0.0, sample_rate=SR
        )
        y = np.stack(
            [
                np.asarray(own(jnp.asarray(x if x.shape[0] == 2 else x[0]))).reshape(
                    x.shape
                )
                for x in d[name]
            ]
        )
        print(
            f"Compressor (retrax's definition) {name} against dasp at "
            f"{NORMAL}: {_rel(y, d[f'normal_{name}']):.2f}"
        )
    f32 = lambda k: jnp.asarray(d[k], jnp.float32)  # noqa: E731
    y = jax.vmap(lambda w, x: fx.DaspStereoWidener(w)(x))(f32("width"), f32("stereo"))
    print(f"DaspStereoWidener float32: {_rel(y, d['widener']):.1e}")
    y = jax.vmap(lambda p, x: fx.DaspStereoPanner(p)(x))(f32("pan"), f32("mono")[:, 0])
    print(f"DaspStereoPanner float32: {_rel(y, d['panner']):.1e}")
    tracks = f32("tracks").transpose(0, 2, 1, 3)  # (B, tracks, 2, T)
    y = jax.vmap(fx.stereo_bus)(tracks, f32("sends")[..., 0])
    print(f"stereo_bus float32: {_rel(y, d['bus']):.1e}")
    for name in LOSSES:
        loss = retrax_loss(name)
        v32 = float(loss(f32("pred"), f32("target")))
        ref32 = float(d[f"loss32_{name}"])
        pred, target = (jnp.asarray(d[k][:1, :, :8192]) for k in ("pred", "target"))
        v64, g64 = jax.value_and_grad(loss)(pred, target)
        ref64 = float(d[f"loss64_{name}"])
        print(
            f"{name}: float32 {abs(v32 - ref32) / abs(ref32):.1e}, float64 "
            f"{abs(float(v64) - ref64) / abs(ref64):.1e}, float64 gradient "
            f"{_rel(g64, d[f'grad64_{name}']):.1e}"
        )


if __name__ == "__main__":
    {"peers": peers, "retrax": ours}[sys.argv[1]](sys.argv[2])
