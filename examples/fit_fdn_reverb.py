"""Fit a feedback delay network's decay to a target impulse response.

The target is exponentially decaying noise whose octave bands (125 Hz to
4 kHz) decay with given reverberation times, from 1.4 s in the lowest band
to 0.5 s in the highest. The model is an 8-line feedback delay network with
a lossless Householder feedback matrix and, after each delay line, a
zero-phase attenuation $\\Gamma_i(\\omega) = 10^{-3 m_i / (f_s T_{60}(\\omega))}$
(Jot's rule: 60 dB of decay every $T_{60}(\\omega)$ seconds), where
$\\log T_{60}(\\omega)$ is interpolated linearly in log frequency between six
learned values at the octave-band centres. Its impulse response comes from
`retrax.ops.fdn_impulse_response(..., method="frequency")` (frequency
sampling: batched linear solves on the unit circle and an inverse FFT), and
Adam (optax) fits the six decay times in two stages: first by
`retrax.losses.EnergyDecayLoss`, the L1 distance of the octave-band energy
decay curves in dB (robust from a distant start), then by the squared log
ratio of the decay times themselves, measured from each octave band's energy
decay curve by a -5 to -35 dB line fit (`retrax.losses.t60_from_edc`, which
differentiates). The decay times of target and fit are measured the same way
and compared after each stage.

Run: `python examples/fit_fdn_reverb.py` (add `--smoke` for a short check
and `--plot PATH` to save a PNG).
"""

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.signal

from retrax.losses import (
    EnergyDecayLoss,
    energy_decay_curve,
    octave_band_sos,
    octave_band_split,
    octave_bands,
    t60_from_edc,
)
from retrax.ops import fdn_impulse_response


SAMPLE_RATE = 16_000
F_MIN, F_MAX = 125.0, 4000.0  # octave bands 125 Hz ... 4 kHz
TARGET_T60 = np.array([1.4, 1.2, 1.0, 0.85, 0.7, 0.5])  # seconds, per band
DELAYS = (499, 547, 601, 653, 709, 773, 839, 907)  # 31 to 57 ms
PRE_DELAY = min(DELAYS)


def decaying_noise(length, pre_delay, seed=0):
    """Noise whose octave band b decays by 60 dB every TARGET_T60[b] seconds,
    starting after `pre_delay` samples of silence."""
    rng = np.random.default_rng(seed)
    n = length - pre_delay
    t = np.arange(n) / SAMPLE_RATE
    noise = rng.standard_normal(n)
    sos = octave_band_sos(SAMPLE_RATE, 1, F_MIN, F_MAX)
    bands = np.stack([scipy.signal.sosfilt(s, noise) for s in sos])
    envelopes = 10.0 ** (-3 * t[None, :] / TARGET_T60[:, None])
    noise = np.sum(bands * envelopes, axis=0)
    return jnp.asarray(np.concatenate([np.zeros(pre_delay), noise]))


def network():
    """A lossless Householder feedback matrix and fixed input/output gains."""
    rng = np.random.default_rng(1)
    n = len(DELAYS)
    u = np.ones(n) / np.sqrt(n)
    A = np.eye(n) - 2 * np.outer(u, u)
    b = rng.choice([-1.0, 1.0], n) / np.sqrt(n)
    c = rng.choice([-1.0, 1.0], n) / np.sqrt(n)
    return jnp.asarray(A), jnp.asarray(b), jnp.asarray(c)


# --8<-- [start:model]
def line_gains(log_t60, n_fft):
    """Each line's attenuation per FFT bin, from the band decay times."""
    centres = octave_bands(1, F_MIN, F_MAX)[1]
    freqs = np.fft.rfftfreq(n_fft, 1 / SAMPLE_RATE)
    log_f = np.log(np.maximum(freqs, 1.0))
    t60 = jnp.exp(jnp.interp(log_f, np.log(centres), log_t60))  # (bins,)
    m = np.asarray(DELAYS)
    return 10.0 ** (-3 * m[None, :] / (SAMPLE_RATE * t60[:, None]))


@functools.partial(jax.jit, static_argnums=1)
def fdn_response(log_t60, length):
    A, b, c = network()
    n_fft = 2 * length  # room for the tail, so that little of it aliases
    return fdn_impulse_response(
        DELAYS, A, b, c, length=length, method="frequency", n_fft=n_fft,
        line_gains=line_gains(log_t60, n_fft),
    )  # fmt: skip


# --8<-- [end:model]


@jax.jit
def measured_t60(h):
    bands = octave_band_split(h, SAMPLE_RATE, 1, F_MIN, F_MAX)
    return t60_from_edc(energy_decay_curve(bands), SAMPLE_RATE)


def save_plot(path, losses, target, fitted, initial, length):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    centres = octave_bands(1, F_MIN, F_MAX)[1]
    curves = [
        np.asarray(energy_decay_curve(octave_band_split(h, SAMPLE_RATE, 1, F_MIN,
                                                        F_MAX), eps=1e-12))
        for h in (target, fitted, initial)
    ]  # fmt: skip
    t = np.arange(length) / SAMPLE_RATE
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), layout="constrained")
    left.semilogy(losses)
    left.set_xlabel("Adam step")
    left.set_ylabel("EDC loss (dB)")
    left.set_title("Training loss")
    colours = plt.cm.viridis(np.linspace(0, 0.9, len(centres)))
    for i, colour in enumerate(colours):
        label = f"{centres[i]:.0f} Hz"
        right.plot(t, curves[0][i], "-", color=colour, label=label)
        right.plot(t, curves[1][i], "--", color=colour)
        right.plot(t, curves[2][i], ":", color=colour, alpha=0.5)
    right.set_ylim(-80, 2)
    right.set_xlabel("time (s)")
    right.set_ylabel("energy decay (dB)")
    right.set_title("Octave-band EDCs: target (-), fit (--), start (:)")
    right.legend(fontsize=7, ncols=2)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")


def report(centres, target_t60, fitted_t60):
    errors = fitted_t60 / target_t60 - 1
    print("band     T60 given  measured:  target   fitted FDN   error")
    for i, f in enumerate(centres):
        print(
            f"{f:6.0f} Hz  {TARGET_T60[i]:6.2f} s           {target_t60[i]:6.3f} s"
            f"   {fitted_t60[i]:6.3f} s   {100 * errors[i]:+6.2f}%"
        )
    print(f"largest error {100 * np.max(np.abs(errors)):.2f}%\n")
    return errors


def fit(loss_fn, log_t60, steps, learning_rate, name):
    optimizer = optax.adam(optax.cosine_decay_schedule(learning_rate, steps, 0.1))
    state = optimizer.init(log_t60)

    @jax.jit
    def step(log_t60, state):
        loss, grad = jax.value_and_grad(loss_fn)(log_t60)
        updates, state = optimizer.update(grad, state)
        return optax.apply_updates(log_t60, updates), state, loss

    losses = []
    start = time.perf_counter()
    for i in range(steps):
        log_t60, state, loss = step(log_t60, state)
        losses.append(float(loss))
        if i % max(steps // 4, 1) == 0 or i == steps - 1:
            print(f"step {i:4d}  {name} {losses[-1]:.4g}")
    print(f"{steps} Adam steps in {time.perf_counter() - start:.1f} s\n")
    return log_t60, losses


def main(smoke: bool = False, plot: str | None = None) -> dict:
    length = SAMPLE_RATE if smoke else 2 * SAMPLE_RATE
    steps = (20, 20) if smoke else (100, 100)
    # the reverb's tail starts when the network's lines first return sound
    target = decaying_noise(length, pre_delay=PRE_DELAY)
    target_t60 = measured_t60(target)
    centres = octave_bands(1, F_MIN, F_MAX)[1]
    initial = jnp.full(len(TARGET_T60), np.log(0.8))  # 0.8 s in every band

    # --8<-- [start:training]
    # 1. the shape of every band's decay: the EDC loss, from far away
    edc_loss = EnergyDecayLoss(
        SAMPLE_RATE, fraction=1, f_min=F_MIN, f_max=F_MAX, eps=1e-5
    )  # curves compared down to 50 dB below their start

    def shape_loss(log_t60):
        return edc_loss(fdn_response(log_t60, length), target)

    # 2. the decay times themselves, measured as for the target (-5 to -35 dB)
    def decay_time_loss(log_t60):
        t60 = measured_t60(fdn_response(log_t60, length))
        return jnp.mean(jnp.log(t60 / target_t60) ** 2)

    log_t60, losses = fit(shape_loss, initial, steps[0], 0.05, "EDC loss (dB)")
    # --8<-- [end:training]
    print("after fitting the energy decay curves:")
    after_edc = np.asarray(measured_t60(fdn_response(log_t60, length)))
    edc_errors = report(centres, np.asarray(target_t60), after_edc)
    log_t60, t60_losses = fit(decay_time_loss, log_t60, steps[1], 0.02,
                              "decay-time loss")  # fmt: skip
    fitted = fdn_response(log_t60, length)
    fitted_t60 = np.asarray(measured_t60(fitted))
    print("after fitting the decay times:")
    errors = report(centres, np.asarray(target_t60), fitted_t60)
    if plot is not None:
        save_plot(plot, losses, target, fitted, fdn_response(initial, length),
                  length)  # fmt: skip
    return {
        "edc_losses": losses,
        "t60_losses": t60_losses,
        "target_t60": np.asarray(target_t60),
        "fitted_t60": fitted_t60,
        "edc_errors": edc_errors,
        "errors": errors,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    main(smoke=args.smoke, plot=args.plot)
