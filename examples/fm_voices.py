"""A six-operator FM voice, played 1,024 times at once, and its gradient.

A DX7-style voice: six sine operators, each with a frequency ratio to the
note, a level and an attack-decay envelope, wired as three two-operator
stacks (the DX7's algorithm 5): operators 2, 4 and 6 modulate the phases of
the carriers 1, 3 and 5, whose outputs are mixed. Every part is a retrax
primitive: `retrax.synth.fm_operator` (on the drift-free phase accumulator)
and `retrax.ops.linear_recurrence` for the envelopes' attack.

The script

1. renders 1,024 voices (different notes and velocities) with one `jax.vmap`
   and reports the aggregate real-time factor on this CPU, in float32;
2. takes the gradient of a spectral loss (log-magnitude STFT distance to a
   target voice) with respect to the six operator ratios, in float64, and
   checks it against central finite differences.

Run: `python examples/fm_voices.py` (add `--smoke` for a few-second check).
"""

import argparse
import os
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from retrax.ops import linear_recurrence
from retrax.synth import fm_operator


SAMPLE_RATE = 44_100
# Algorithm 5: (modulator, carrier) pairs, zero-based operator indices.
MODULATORS = (1, 3, 5)
CARRIERS = (0, 2, 4)


class Patch(eqx.Module):
    """The sound of a voice: one entry per operator."""

    ratio: jax.Array  # frequency / note frequency
    level: jax.Array  # carrier: output level; modulator: modulation index (rad)
    attack: jax.Array  # attack time constant, seconds
    decay: jax.Array  # decay time constant, seconds


def electric_piano(dtype=jnp.float32) -> Patch:
    """A bright, bell-like electric piano (loosely after the DX7's E.PIANO 1)."""
    return Patch(
        ratio=jnp.asarray([1.0, 1.0, 1.0, 14.0, 1.0, 3.0], dtype),
        level=jnp.asarray([0.5, 1.8, 0.3, 0.9, 0.2, 1.2], dtype),
        attack=jnp.asarray([0.002, 0.002, 0.002, 0.001, 0.003, 0.002], dtype),
        decay=jnp.asarray([1.5, 0.8, 1.2, 0.15, 2.0, 0.5], dtype),
    )


# --8<-- [start:voice]
def envelope(attack, decay, num_samples, dtype):
    """Attack by a one-pole rise towards 1, then an exponential decay."""
    t = jnp.arange(num_samples, dtype=dtype) / SAMPLE_RATE
    pole = jnp.exp(-1 / (attack * SAMPLE_RATE))
    rise = linear_recurrence((1 - pole) * jnp.ones(num_samples, dtype), decay=pole)
    return rise * jnp.exp(-t / decay)


def voice(patch: Patch, note_hz, velocity, num_samples: int):
    """One note of the patch: `num_samples` samples of audio."""
    dtype = patch.ratio.dtype
    t = jnp.arange(num_samples, dtype=dtype) / SAMPLE_RATE
    vibrato = 1 + 0.002 * jnp.sin(2 * jnp.pi * 5.5 * t)
    freqs = patch.ratio[:, None] * (note_hz * vibrato)[None, :]  # (6, T)
    envs = jax.vmap(envelope, (0, 0, None, None))(
        patch.attack, patch.decay, num_samples, dtype
    )
    levels = patch.level[:, None] * envs
    # Velocity brightens the sound: it scales the modulation indices.
    mods, cars = jnp.asarray(MODULATORS), jnp.asarray(CARRIERS)
    operator = jax.vmap(fm_operator, (0, None, 0, 0))
    modulation = operator(
        freqs[mods], SAMPLE_RATE, jnp.zeros_like(freqs[mods]), velocity * levels[mods]
    )
    carriers = operator(freqs[cars], SAMPLE_RATE, modulation, levels[cars])
    return jnp.sum(carriers, axis=0)


# --8<-- [end:voice]


def render_many(patch, num_voices, seconds):
    """`num_voices` notes of the patch, one `vmap`, float32; returns timing."""
    rng = np.random.default_rng(0)
    notes = rng.integers(36, 96, num_voices)  # MIDI notes C2 to B6
    note_hz = jnp.asarray(440.0 * 2 ** ((notes - 69) / 12), jnp.float32)
    velocity = jnp.asarray(rng.uniform(0.3, 1.0, num_voices), jnp.float32)
    num_samples = round(seconds * SAMPLE_RATE)
    render = jax.jit(
        jax.vmap(lambda f, v: voice(patch, f, v, num_samples)),
    )
    start = time.perf_counter()
    audio = jax.block_until_ready(render(note_hz, velocity))
    compile_s = time.perf_counter() - start
    wall, cpu = [], []
    for _ in range(2):
        start, start_cpu = time.perf_counter(), time.process_time()
        audio = jax.block_until_ready(render(note_hz, velocity))
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    # Wall-clock time is what real time means; the process's CPU time (all
    # its threads) says what the render costs when the machine is shared.
    return audio, compile_s, min(wall), min(cpu)


def log_spectrogram(x, frame=512, hop=256):
    frames = (len(x) - frame) // hop + 1
    idx = hop * jnp.arange(frames)[:, None] + jnp.arange(frame)[None, :]
    window = jnp.hanning(frame).astype(x.dtype)
    spec = jnp.fft.rfft(x[idx] * window, axis=-1)
    return jnp.log(jnp.abs(spec) ** 2 + 1e-6)


def spectral_loss(ratio, patch, target_spec, num_samples):
    y = voice(eqx.tree_at(lambda p: p.ratio, patch, ratio), 220.0, 1.0, num_samples)
    return jnp.mean((log_spectrogram(y) - target_spec) ** 2)


def gradient_check(seconds):
    """d loss / d ratios by autodiff and by central differences, float64."""
    with jax.enable_x64(True):
        patch = electric_piano(jnp.float64)
        num_samples = round(seconds * SAMPLE_RATE)
        target = voice(patch, 220.0, 1.0, num_samples)
        target_spec = log_spectrogram(target)
        # Start away from the target: every ratio detuned a little.
        ratio = patch.ratio * jnp.asarray([1.01, 0.99, 1.02, 1.003, 0.98, 1.01])
        loss = jax.jit(lambda r: spectral_loss(r, patch, target_spec, num_samples))
        grad = jax.jit(jax.grad(loss))(ratio)
        step = 1e-6
        fd = []
        for i in range(6):
            e = jnp.zeros(6).at[i].set(step)
            fd.append((loss(ratio + e) - loss(ratio - e)) / (2 * step))
        fd = jnp.stack(fd)
        return float(loss(ratio)), np.asarray(grad), np.asarray(fd)


def main(smoke: bool = False) -> dict:
    num_voices, seconds = (64, 0.1) if smoke else (1024, 0.1)
    print(
        f"jax {jax.__version__}, {jax.default_backend()} backend, "
        f"{os.cpu_count()} cores"
    )
    audio, compile_s, run_s, cpu_s = render_many(electric_piano(), num_voices, seconds)
    realtime = num_voices * seconds / run_s
    peak = float(jnp.max(jnp.abs(audio)))
    print(
        f"{num_voices} voices x {seconds:g} s, 6 operators each, float32: "
        f"{run_s:.3f} s per render, {cpu_s:.3f} s of CPU time "
        f"(first call, with compilation: {compile_s:.1f} s)"
    )
    print(
        f"aggregate real-time factor: {realtime:.1f}x by the wall clock, "
        f"{num_voices * seconds / cpu_s:.1f}x per CPU second  (peak |y| = {peak:.2f})"
    )

    loss, grad, fd = gradient_check(0.05 if smoke else 0.1)
    rel = np.max(np.abs(grad - fd)) / np.max(np.abs(fd))
    print(f"spectral loss at the detuned ratios: {loss:.6f}")
    print("d loss / d ratio, autodiff:       ", np.array2string(grad, precision=6))
    print("d loss / d ratio, central diff.:  ", np.array2string(fd, precision=6))
    print(f"max |autodiff - fd| / max |fd|: {rel:.2e}")
    return {
        "audio_shape": audio.shape,
        "finite": bool(jnp.all(jnp.isfinite(audio))),
        "peak": peak,
        "realtime_factor": realtime,
        "render_s": run_s,
        "render_cpu_s": cpu_s,
        "loss": loss,
        "grad": grad,
        "fd": fd,
        "grad_rel_error": float(rel),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    main(parser.parse_args().smoke)
