"""Recover a parametric equaliser's gains, frequencies and Qs from EQ'd noise.

A four-section `ParametricEQ` (a low shelf, two peaking bands, a high shelf)
colours half a second of white noise. A second equaliser, started flat with
its bands in the wrong places, learns all twelve parameters in two stages:

1. a **log-spectral loss**, minimised with optax's L-BFGS: the squared
   difference of the two signals' short-time spectra in dB, weighted equally
   per octave. A waveform loss weighs frequencies linearly, so the kilohertz
   range dominates it and the bass bands settle in a wrong local minimum; in
   dB every band counts;
2. a **waveform loss** (relative squared error), which is exactly zero at the
   true parameters and sharpens the estimate once it is close. It is a sum of
   squares, so it is minimised with Levenberg-Marquardt steps, which use its
   Jacobian (one forward-mode pass per parameter) and converge in a few steps
   where a gradient method creeps along the loss's narrow valleys; it stops
   when no step lowers the loss any more (its floating-point floor).

Both stages train the equaliser's unconstrained vector
(`ParametricEQ.to_unconstrained` of an `ordered=True` equaliser: the
logarithms of the gaps of log frequency between the sections, and below and
above them, relative to the last gap, 60 artanh(g / 60) of the gains g in dB,
inverse softplus of the Qs), from which each loss builds the equaliser
with `ParametricEQ.with_unconstrained`, so every step, and every point a line
search tries, is a valid equaliser: frequencies in range and in order, stable
sections. The equaliser runs as one `sosfilt` cascade, whose gradient is the
adjoint cascade run backwards in time and whose forward-mode derivative is the
same cascade driven by the tangent.

Run: `python examples/parameter_estimation/fit_parametric_eq.py` (add
`--smoke` for a few-second check and `--plot PATH` to save a PNG). Target and
fitted audio go to `examples/outputs/` as WAV files.
"""

import argparse
import pathlib
import time
import wave

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import optax

from retrax.filters import ParametricEQ
from retrax.ops import sosfreqz


OUTPUTS = pathlib.Path(__file__).resolve().parent.parent / "outputs"


def write_wav(path, signal, sample_rate, peak):
    """16-bit mono WAV, scaled by `peak` (shared between files, for comparison)."""
    pcm = np.clip(np.asarray(signal) / peak, -1, 1)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes((pcm * 32767).astype("<i2").tobytes())
    print(f"wrote {path.relative_to(OUTPUTS.parent.parent)}")


# --8<-- [start:lbfgs]
def lbfgs_fit(loss_fn, params, iterations, log=None):
    """Minimise `loss_fn` with optax's L-BFGS; returns params and the losses."""
    optimizer = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss_fn)

    @jax.jit
    def step(params, state):
        loss, grad = value_and_grad(params, state=state)
        updates, state = optimizer.update(
            grad, state, params, value=loss, grad=grad, value_fn=loss_fn
        )
        return optax.apply_updates(params, updates), state, loss

    # optax's L-BFGS state holds weakly typed scalars, which turn strong after
    # one step: make them strong now, so that `step` compiles once, not twice.
    state = jax.tree.map(lambda v: jnp.asarray(v, v.dtype), optimizer.init(params))
    losses = []
    for i in range(iterations):
        params, state, loss = step(params, state)
        losses.append(float(loss))
        if log is not None and i % max(iterations // 4, 1) == 0:
            print(f"{log} iteration {i:3d}  loss {losses[-1]:.3e}")
    return params, losses


# --8<-- [end:lbfgs]


# --8<-- [start:lm]
def levenberg_marquardt_fit(residual_fn, params, iterations, log=None):
    """Minimise `sum(residual_fn(params) ** 2)` with Levenberg-Marquardt steps;
    returns params and the losses (each before its step). Stops early once
    three steps in a row fail to lower the loss: it is then at its
    floating-point floor."""
    flat, unravel = jax.flatten_util.ravel_pytree(params)

    def residuals(p):
        return residual_fn(unravel(p))

    @jax.jit
    def step(p, damping):
        r = residuals(p)
        jac = jax.jacfwd(residuals)(p)  # one forward-mode pass per parameter
        # Marquardt's damping, scaled per parameter, solved as a least-squares
        # problem: the normal equations would square its condition number,
        # which float32 cannot afford.
        scale = jnp.linalg.norm(jac, axis=0)
        system = jnp.concatenate([jac, jnp.diag(jnp.sqrt(damping) * scale)])
        rhs = jnp.concatenate([r, jnp.zeros_like(p)])
        trial = p - jnp.linalg.lstsq(system, rhs)[0]
        loss, trial_loss = jnp.sum(r**2), jnp.sum(residuals(trial) ** 2)
        better = trial_loss < loss
        p = jnp.where(better, trial, p)
        damping = jnp.where(better, damping / 3, damping * 4)
        return p, damping, loss, better

    damping = jnp.asarray(1e-3, flat.dtype)
    losses, rejected = [], 0
    for i in range(iterations):
        flat, damping, loss, better = step(flat, damping)
        losses.append(float(loss))
        rejected = 0 if better else rejected + 1
        if log is not None:
            print(f"{log} iteration {i:3d}  loss {losses[-1]:.3e}")
        if rejected == 3:
            break
    return unravel(flat), losses


# --8<-- [end:lm]


def describe(eq):
    return np.stack([np.asarray(eq.freqs), np.asarray(eq.gains_db), np.asarray(eq.qs)])


def save_plot(path, losses, stage_one, true_eq, fitted, initial, sample_rate):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
    left.semilogy(losses[:stage_one], label="log-spectral")
    left.semilogy(range(stage_one, len(losses)), losses[stage_one:], label="waveform")
    left.set_xlabel("iteration (L-BFGS, then Levenberg-Marquardt)")
    left.set_ylabel("loss")
    left.set_title("Training loss (two stages)")
    left.legend()
    freqs = np.geomspace(20, sample_rate / 2, 512)
    for label, eq, style in [
        ("initial", initial, ":"),
        ("true", true_eq, "-"),
        ("fitted", fitted, "--"),
    ]:
        _, h = sosfreqz(eq.sos, jnp.asarray(freqs), fs=sample_rate)
        right.semilogx(freqs, 20 * np.log10(np.abs(np.asarray(h))), style, label=label)
    right.set_xlabel("frequency (Hz)")
    right.set_ylabel("magnitude (dB)")
    right.set_title("Equaliser response")
    right.legend()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")


def main(smoke: bool = False, plot: str | None = None) -> dict:
    sample_rate = 44_100
    length = sample_rate // 4 if smoke else sample_rate // 2
    spectral_iterations, waveform_iterations = (30, 0) if smoke else (40, 20)
    x = jax.random.normal(jax.random.key(0), (length,))

    # --8<-- [start:target]
    true_eq = ParametricEQ(
        freqs=[120.0, 500.0, 2500.0, 8000.0],  # low shelf, 2 peaks, high shelf
        gains_db=[4.0, -6.0, 5.0, -3.0],
        qs=[0.7071, 2.0, 1.5, 0.7071],
        sample_rate=sample_rate,
    )
    target = true_eq(x)
    # ordered: the unconstrained map keeps the sections in frequency order
    initial = ParametricEQ(
        [200.0, 800.0, 3000.0, 6000.0], sample_rate=sample_rate, ordered=True
    )
    # --8<-- [end:target]

    # --8<-- [start:losses]
    frame, hop = 2048, 512
    window = jnp.hanning(frame)
    bins = jnp.fft.rfftfreq(frame, 1 / sample_rate)
    per_octave = jnp.where(bins > 20, 1 / jnp.maximum(bins, 1.0), 0.0)
    per_octave = per_octave / jnp.sum(per_octave)  # equal weight per octave

    def spectrogram_db(y):
        starts = jnp.arange(0, y.shape[0] - frame, hop)
        frames = y[starts[:, None] + jnp.arange(frame)] * window
        return 10 * jnp.log10(jnp.abs(jnp.fft.rfft(frames)) ** 2 + 1e-6)

    target_db = spectrogram_db(target)

    def spectral_loss(eq):
        error = (spectrogram_db(eq(x)) - target_db) ** 2
        return jnp.mean(jnp.sum(error * per_octave, -1))

    def waveform_residuals(eq):  # their sum of squares: the relative squared error
        return (eq(x) - target) / jnp.sqrt(jnp.sum(target**2))

    # --8<-- [end:losses]

    # --8<-- [start:fit]
    def of_theta(fn):
        """`fn` of the equaliser built from its unconstrained vector."""
        return lambda theta: fn(initial.with_unconstrained(jnp.concatenate(theta)))

    start = time.perf_counter()
    # the entries of the frequencies, the gains and the Qs, as three arrays
    theta = jnp.split(initial.to_unconstrained(), 3)
    theta, losses = lbfgs_fit(
        of_theta(spectral_loss), theta, spectral_iterations, "spectral"
    )
    theta, more = levenberg_marquardt_fit(
        of_theta(waveform_residuals), theta, waveform_iterations, "waveform"
    )
    eq = initial.with_unconstrained(jnp.concatenate(theta))
    elapsed = time.perf_counter() - start
    # --8<-- [end:fit]
    losses += more

    truth, found = describe(true_eq), describe(eq)
    errors = np.abs(found - truth)
    relative = {
        "freq": float(np.max(errors[0] / truth[0])),
        "gain_db": float(np.max(errors[1])),
        "q": float(np.max(errors[2] / truth[2])),
    }
    start_error = np.abs(describe(initial) - truth)
    initial_errors = {
        "freq": float(np.max(start_error[0] / truth[0])),
        "gain_db": float(np.max(start_error[1])),
        "q": float(np.max(start_error[2] / truth[2])),
    }
    print(
        f"\n{spectral_iterations} L-BFGS + {len(more)} Levenberg-Marquardt iterations "
        f"on {length} samples in {elapsed:.2f} s (including compilation)"
    )
    names = ["low shelf", "peak 1", "peak 2", "high shelf"]
    print("section      frequency (Hz)         gain (dB)          Q")
    print("             true    fitted      true  fitted      true  fitted")
    for i, name in enumerate(names):
        print(
            f"{name:10s} {truth[0, i]:7.1f} {found[0, i]:9.2f}   "
            f"{truth[1, i]:+6.2f} {found[1, i]:+7.3f}    "
            f"{truth[2, i]:6.3f} {found[2, i]:7.4f}"
        )
    print(
        f"worst errors: frequency {100 * relative['freq']:.2f}%, gain "
        f"{relative['gain_db']:.3f} dB, Q {100 * relative['q']:.2f}% "
        f"(from {100 * initial_errors['freq']:.0f}%, "
        f"{initial_errors['gain_db']:.0f} dB, {100 * initial_errors['q']:.0f}%)"
    )

    OUTPUTS.mkdir(exist_ok=True)
    peak = float(jnp.max(jnp.abs(target)))
    write_wav(OUTPUTS / "eq_target.wav", target, sample_rate, peak)
    write_wav(OUTPUTS / "eq_fitted.wav", eq(x), sample_rate, peak)
    if plot is not None:
        save_plot(plot, losses, spectral_iterations, true_eq, eq, initial, sample_rate)
    return {
        "losses": losses,
        "errors": relative,
        "initial_errors": initial_errors,
        "spectral_iterations": spectral_iterations,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--plot", metavar="PATH", help="save a PNG of the fit")
    args = parser.parse_args()
    main(args.smoke, args.plot)
