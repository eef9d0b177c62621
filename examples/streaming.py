"""Filter a long signal block by block, with the same result as one call.

A sweeping resonant all-pole filter colours ten seconds of synthesised audio,
and a one-pole envelope follower (`linear_recurrence`) tracks the filtered
signal's level. Both run on blocks of 4,096 samples, as a real-time audio
callback would see them: `return_zf=True` hands each block's final state to the
next block as its `zi`. The blocks, stitched together, equal one call on the
whole signal.

Run: `python examples/streaming.py` (add `--smoke` for a few-second check, and
`--plot PATH` to save a PNG of the signals).
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from retrax.ops import allpole, linear_recurrence


def synthesise(key, length, sample_rate):
    """Noise bursts and a gliding tone, eight bursts a second."""
    t = jnp.arange(length) / sample_rate
    noise = jax.random.normal(key, (length,))
    bursts = jnp.exp(-30 * jnp.mod(t, 0.125)) * noise
    tone = 0.2 * jnp.sin(2 * jnp.pi * (220 * t + 20 * t**2))
    return bursts + tone


def sweeping_resonance(length, sample_rate, radius=0.98):
    """A conjugate pole pair gliding from 200 Hz to 4 kHz.

    Returns the per-sample coefficients, shape `(length, 2)`, and the input gain
    that brings the resonance peak to about 0 dB at every frequency.
    """
    freq = jnp.geomspace(200.0, 4000.0, length)
    angle = 2 * jnp.pi * freq / sample_rate
    a = jnp.stack([-2 * radius * jnp.cos(angle), jnp.full_like(angle, radius**2)], -1)
    gain = (1 - radius) * jnp.sqrt(1 - 2 * radius * jnp.cos(2 * angle) + radius**2)
    return a, gain


def envelope_decay(sample_rate, time_constant=0.01):
    """The one-pole decay per sample for a time constant in seconds."""
    return float(np.exp(-1 / (time_constant * sample_rate)))


# --8<-- [start:process]
def process(x, gain, a, decay, state=None):
    """Filter, then follow the envelope; `state` is `(filter zi, envelope zi)`."""
    filter_zi, envelope_zi = (None, None) if state is None else state
    y, filter_zf = allpole(gain * x, a, filter_zi, return_zf=True)
    envelope, envelope_zf = linear_recurrence(
        (1 - decay) * jnp.abs(y), decay=decay, zi=envelope_zi, return_zf=True
    )
    return (y, envelope), (filter_zf, envelope_zf)


# --8<-- [end:process]


def save_plot(path, y, envelope, sample_rate, block):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.arange(len(y)) / sample_rate
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 4.5), layout="constrained")
    step = 8  # thin the drawn samples; the envelope is smooth at this scale
    top.plot(t[::step], y[::step], color="0.75", lw=0.4, label="filtered signal")
    top.plot(t, envelope, color="C0", lw=1, label="envelope (one-pole, 10 ms)")
    top.set_xlabel("time (s)")
    top.set_title("The whole signal, processed in blocks")
    top.legend(loc="upper right")
    edge = 3 * block  # zoom on a block boundary
    sl = slice(edge - 600, edge + 600)
    bottom.plot(t[sl] * 1e3, y[sl], color="C1", lw=1, label="filtered")
    bottom.plot(t[sl] * 1e3, envelope[sl], color="C0", lw=1.5, label="envelope")
    bottom.axvline(t[edge] * 1e3, color="k", ls="--", lw=1, label="block boundary")
    bottom.set_xlabel("time (ms)")
    bottom.set_title("Around a block boundary: no click, no reset")
    bottom.legend(loc="upper right", fontsize="small")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")


def main(smoke: bool = False, plot: str | None = None) -> dict:
    sample_rate = 44_100
    seconds = 1 if smoke else 10
    block = 4_096
    length = seconds * sample_rate
    x = synthesise(jax.random.key(0), length, sample_rate)
    a, gain = sweeping_resonance(length, sample_rate)
    decay = envelope_decay(sample_rate)

    # --8<-- [start:blocks]
    # One call on the whole signal.
    (y_full, env_full), _ = jax.jit(process)(x, gain, a, decay)

    # The same signal in blocks. The last block is shorter, so the jitted
    # block function compiles for two shapes.
    process_block = jax.jit(process)
    state = (jnp.zeros(2), jnp.zeros(()))
    ys, envs = [], []
    start = time.perf_counter()
    for lo in range(0, length, block):
        hi = min(lo + block, length)
        (y, env), state = process_block(x[lo:hi], gain[lo:hi], a[lo:hi], decay, state)
        ys.append(y)
        envs.append(env)
    y_blocks = jnp.concatenate(ys)
    env_blocks = jnp.concatenate(envs)
    # --8<-- [end:blocks]
    elapsed = time.perf_counter() - start

    y_diff = float(jnp.max(jnp.abs(y_blocks - y_full)))
    env_diff = float(jnp.max(jnp.abs(env_blocks - env_full)))
    print(f"{seconds} s at {sample_rate} Hz in {len(ys)} blocks of up to {block}")
    print(f"blocks processed in {elapsed:.2f} s (including compilation)")
    print(f"max |y|                         {float(jnp.max(jnp.abs(y_full))):.3f}")
    print(f"max |blocks - one call|, filter {y_diff:.3e}")
    print(f"max |blocks - one call|, envelope {env_diff:.3e}")
    if plot is not None:
        save_plot(
            plot,
            np.asarray(y_blocks),
            np.asarray(env_blocks),
            sample_rate,
            block,
        )
    return {
        "y_blocks": y_blocks,
        "y_full": y_full,
        "envelope_blocks": env_blocks,
        "envelope_full": env_full,
        "y_diff": y_diff,
        "envelope_diff": env_diff,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--plot", metavar="PATH", help="save a PNG of the signals")
    args = parser.parse_args()
    main(args.smoke, args.plot)
