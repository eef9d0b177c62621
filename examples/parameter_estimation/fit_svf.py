"""Recover a state-variable filter's cutoff and resonance from audio.

A resonant lowpass `SVF` (cutoff 1.8 kHz, Q 3) colours a mix of plucked
strings (Karplus-Strong) and a little noise. A second `SVF`, started an octave
and a half too low and without resonance, learns cutoff and Q with Adam
(optax) until its output matches the target. Adam trains the filter's
unconstrained vector (`SVF.to_unconstrained`: the logit of `cutoff / nyquist`
and the inverse softplus of Q), from which the loss builds the filter with
`SVF.with_unconstrained`, so every step is a valid filter; every gradient runs
the SVF's adjoint backwards in time.

Run: `python examples/parameter_estimation/fit_svf.py` (add `--smoke` for a
few-second check and `--plot PATH` to save a PNG). Target and fitted audio go
to `examples/outputs/` as WAV files.
"""

import argparse
import pathlib
import time
import wave

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.signal

from retrax.filters import SVF


OUTPUTS = pathlib.Path(__file__).resolve().parent.parent / "outputs"


def karplus_strong(freq, length, sample_rate, rng, decay=0.996):
    """A plucked string: a noise burst through a damped, averaging delay loop."""
    period = int(round(sample_rate / freq))
    burst = np.zeros(length)
    burst[:period] = rng.uniform(-1, 1, period)
    a = np.zeros(period + 2)
    a[0], a[period], a[period + 1] = 1.0, -0.5 * decay, -0.5 * decay
    return scipy.signal.lfilter([1.0], a, burst)


def synthesise(length, sample_rate, seed=0):
    """Four plucks (A2, E3, A3, C#4) a quarter second apart, plus soft noise."""
    rng = np.random.default_rng(seed)
    x = 0.05 * rng.standard_normal(length)
    for i, freq in enumerate([110.0, 164.8, 220.0, 277.2]):
        start = i * sample_rate // 4
        if start < length:
            x[start:] += karplus_strong(freq, length - start, sample_rate, rng)
    return x / np.max(np.abs(x))


def write_wav(path, signal, sample_rate, peak):
    """16-bit mono WAV, scaled by `peak` (shared between files, for comparison)."""
    pcm = np.clip(np.asarray(signal) / peak, -1, 1)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes((pcm * 32767).astype("<i2").tobytes())
    print(f"wrote {path.relative_to(OUTPUTS.parent.parent)}")


def save_plot(path, losses, true_filter, fitted, initial, sample_rate):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
    left.semilogy(losses)
    left.set_xlabel("Adam step")
    left.set_ylabel("relative loss")
    left.set_title("Training loss")
    impulse = jnp.zeros(4096).at[0].set(1.0)
    for label, module, style in [
        ("initial", initial, ":"),
        ("true", true_filter, "-"),
        ("fitted", fitted, "--"),
    ]:
        h = np.fft.rfft(np.asarray(module(impulse)))
        f = np.fft.rfftfreq(impulse.shape[0], 1 / sample_rate)
        right.semilogx(f[1:], 20 * np.log10(np.abs(h[1:])), style, label=label)
    right.set_xlim(20, sample_rate / 2)
    right.set_ylim(-60, 15)
    right.set_xlabel("frequency (Hz)")
    right.set_ylabel("magnitude (dB)")
    right.set_title("SVF lowpass response")
    right.legend()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")


def main(smoke: bool = False, plot: str | None = None) -> dict:
    sample_rate = 44_100
    length = sample_rate // 8 if smoke else sample_rate
    steps = 150 if smoke else 400
    x = jnp.asarray(synthesise(length, sample_rate))

    # --8<-- [start:target]
    true_filter = SVF(cutoff=1800.0, q=3.0, sample_rate=sample_rate)
    target = true_filter(x)
    # --8<-- [end:target]

    # --8<-- [start:training]
    initial = SVF(cutoff=500.0, q=0.7071, sample_rate=sample_rate)
    # [logit(cutoff / nyquist), inverse softplus(q)]: any real vector is a
    # valid filter, so Adam trains this and the loss builds the SVF from it
    theta = initial.to_unconstrained()

    def loss_fn(theta):
        model = initial.with_unconstrained(theta)
        return jnp.mean((model(x) - target) ** 2) / jnp.mean(target**2)

    optimizer = optax.adam(optax.cosine_decay_schedule(0.05, steps, alpha=0.01))
    state = optimizer.init(theta)

    @eqx.filter_jit
    def step(theta, state):
        loss, grads = jax.value_and_grad(loss_fn)(theta)
        updates, state = optimizer.update(grads, state)
        return optax.apply_updates(theta, updates), state, loss

    # --8<-- [end:training]

    losses = []
    start = time.perf_counter()
    for i in range(steps):
        theta, state, loss = step(theta, state)
        losses.append(float(loss))
        if i % max(steps // 5, 1) == 0:
            model = initial.with_unconstrained(theta)
            print(
                f"step {i:4d}  relative loss {losses[-1]:.3e}  "
                f"cutoff {float(model.cutoff):7.1f} Hz  q {float(model.q):.3f}"
            )
    elapsed = time.perf_counter() - start
    model = initial.with_unconstrained(theta)
    final_loss = float(loss_fn(theta))

    cutoff_error = abs(float(model.cutoff / true_filter.cutoff) - 1)
    q_error = abs(float(model.q / true_filter.q) - 1)
    print(f"\n{steps} Adam steps on {length} samples in {elapsed:.2f} s")
    print(f"final relative loss {final_loss:.2e}")
    print(
        f"cutoff: true {float(true_filter.cutoff):.1f} Hz, recovered "
        f"{float(model.cutoff):.2f} Hz (relative error {cutoff_error:.1e})"
    )
    print(
        f"q:      true {float(true_filter.q):.3f}, recovered {float(model.q):.4f} "
        f"(relative error {q_error:.1e})"
    )

    OUTPUTS.mkdir(exist_ok=True)
    fitted = model(x)
    peak = float(jnp.max(jnp.abs(target)))
    write_wav(OUTPUTS / "svf_input.wav", x, sample_rate, 1.0)
    write_wav(OUTPUTS / "svf_target.wav", target, sample_rate, peak)
    write_wav(OUTPUTS / "svf_fitted.wav", fitted, sample_rate, peak)
    if plot is not None:
        save_plot(plot, losses, true_filter, model, initial, sample_rate)
    return {
        "losses": losses,
        "loss": final_loss,
        "cutoff": float(model.cutoff),
        "q": float(model.q),
        "initial_cutoff_error": abs(float(initial.cutoff / true_filter.cutoff) - 1),
        "initial_q_error": abs(float(initial.q / true_filter.q) - 1),
        "cutoff_error": cutoff_error,
        "q_error": q_error,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--plot", metavar="PATH", help="save a PNG of the fit")
    args = parser.parse_args()
    main(args.smoke, args.plot)
