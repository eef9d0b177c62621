"""Recover a compressor's threshold, ratio, attack and release from audio.

A synthesised drum loop (kicks, snares and hi-hats at varying loudness) goes
through a `Compressor` with unknown settings. Knowing the dry loop and the
compressed result, optax's L-BFGS fits a second `Compressor`'s threshold,
ratio, attack and release; its RMS detector time and makeup gain are taken as
known.

Three choices make this work. The loss compares the two signals' short-time
**log envelopes** (in dB), not their waveforms: a compressor acts on level,
and errors in dB weigh the quiet release tails as much as the loud hits. A
quasi-Newton method: threshold and ratio trade off along a long, flat valley
of the loss, which Adam crosses slowly. And a few starting points are trained
**at once**, `jax.vmap` over the L-BFGS step, keeping the one that fits best:
the loss over attack and release is not convex. The switching attack/release
smoother (`ballistics`) is differentiated with its decisions held fixed, and
its gradient runs the time-varying one-pole backwards in time.

Run: `python examples/parameter_estimation/fit_compressor.py` (add `--smoke`
for a few-second check and `--plot PATH` to save a PNG). Dry, target and
fitted audio go to `examples/outputs/` as WAV files.
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

from retrax.dynamics import amp2db, avg, ms2coef
from retrax.filters import Compressor


OUTPUTS = pathlib.Path(__file__).resolve().parent.parent / "outputs"


def drum_loop(length, sample_rate, seed=0, bpm=120):
    """Kick, snare and hi-hat hits on a sixteenth-note grid, random velocities."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(0.5 * sample_rate)) / sample_rate

    def kick():
        phase = 2 * np.pi * (50 * t + 100 * 0.03 * (1 - np.exp(-t / 0.03)))
        return np.sin(phase) * np.exp(-t / 0.15)

    def snare():
        noise = rng.standard_normal(t.shape) * np.exp(-t / 0.06)
        return 0.5 * noise + 0.6 * np.sin(2 * np.pi * 190 * t) * np.exp(-t / 0.05)

    def hat():
        noise = np.diff(rng.standard_normal(t.shape[0] + 1))  # tilted to the top
        return 0.25 * noise * np.exp(-t / 0.015)

    pattern = {0: kick, 4: snare, 8: kick, 10: kick, 12: snare}
    x = np.zeros(length + t.shape[0])
    step = int(sample_rate * 60 / bpm / 4)
    for i, start in enumerate(range(0, length, step)):
        velocity = rng.uniform(0.3, 1.0)
        hit = pattern.get(i % 16, hat)
        x[start : start + t.shape[0]] += velocity * hit()
        if i % 2 == 0 and i % 16 not in pattern:
            x[start : start + t.shape[0]] += velocity * hat()
    x = x[:length]
    return 0.9 * x / np.max(np.abs(x))


def write_wav(path, signal, sample_rate, peak):
    """16-bit mono WAV, scaled by `peak` (shared between files, for comparison)."""
    pcm = np.clip(np.asarray(signal) / peak, -1, 1)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes((pcm * 32767).astype("<i2").tobytes())
    print(f"wrote {path.relative_to(OUTPUTS.parent.parent)}")


def settings(comp):
    return {
        "threshold_db": float(comp.threshold_db),
        "ratio": float(comp.ratio),
        "attack_ms": float(comp.attack_ms),
        "release_ms": float(comp.release_ms),
    }


def save_plot(path, losses, x, comp_true, comp_fit, sample_rate):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
    left.semilogy(np.asarray(losses))
    left.set_xlabel("L-BFGS iteration")
    left.set_ylabel("log-envelope loss (dB$^2$)")
    left.set_title("Training loss, every start")
    t = np.arange(x.shape[0]) / sample_rate
    stop = min(x.shape[0], sample_rate)
    dry = right.twinx()  # the dry loop behind, on its own scale
    dry.plot(t[:stop], np.asarray(x[:stop]), color="0.85", lw=0.4)
    dry.set_yticks([])
    right.set_zorder(dry.get_zorder() + 1)
    right.patch.set_visible(False)
    for label, comp, style in [("true", comp_true, "-"), ("fitted", comp_fit, "--")]:
        gain_db = amp2db(comp.gain(x), floor=1e-6)
        right.plot(t[:stop], np.asarray(gain_db[:stop]), style, label=label)
    right.set_xlabel("time (s)")
    right.set_ylabel("gain (dB)")
    right.set_title("Compressor gain (drum loop in grey)")
    right.legend(loc="lower right", fontsize="small")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")


def main(smoke: bool = False, plot: str | None = None) -> dict:
    sample_rate = 44_100
    length = sample_rate // 2 if smoke else 2 * sample_rate
    steps = 25 if smoke else 40
    x = jnp.asarray(drum_loop(length, sample_rate))

    # --8<-- [start:target]
    true_comp = Compressor(
        threshold_db=-22.0,
        ratio=5.0,
        attack_ms=8.0,
        release_ms=150.0,
        sample_rate=sample_rate,
    )
    target = true_comp(x)
    # --8<-- [end:target]

    # --8<-- [start:loss]
    def log_envelope(y):
        """Level in dB over a 2 ms one-pole average, floored at -80 dB."""
        power = avg(y * y, ms2coef(2.0, sample_rate))
        return 10 * jnp.log10(jnp.maximum(power, 1e-8))

    target_envelope = log_envelope(target)

    # --8<-- [end:loss]

    # --8<-- [start:training]
    # The four unknowns as an unconstrained vector, mapped to the module's
    # physical fields inside the loss, so that every L-BFGS step gives a valid
    # compressor: threshold in units of 10 dB (all four then move on similar
    # scales), ratio = 1 + softplus(u), times = exp(u). The RMS time,
    # expander and makeup keep their values.
    def unknowns(threshold_db, ratio, attack_ms, release_ms):
        ratio = jnp.asarray(ratio, float) - 1
        return jnp.stack(
            [
                jnp.asarray(threshold_db, float) / 10,
                ratio + jnp.log(-jnp.expm1(-ratio)),  # softplus's inverse
                jnp.log(jnp.asarray(attack_ms, float)),
                jnp.log(jnp.asarray(release_ms, float)),
            ]
        )

    defaults = Compressor(sample_rate=sample_rate)

    def with_unknowns(p, comp=defaults):
        return eqx.tree_at(
            lambda c: (c.threshold_db, c.ratio, c.attack_ms, c.release_ms),
            comp,
            (10 * p[0], 1 + jax.nn.softplus(p[1]), jnp.exp(p[2]), jnp.exp(p[3])),
        )

    def loss_fn(p):
        return jnp.mean((log_envelope(with_unknowns(p)(x)) - target_envelope) ** 2)

    optimizer = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss_fn)

    @jax.jit
    @jax.vmap  # every start at once
    def step(p, state):
        loss, grad = value_and_grad(p, state=state)
        updates, state = optimizer.update(
            grad, state, p, value=loss, grad=grad, value_fn=loss_fn
        )
        return optax.apply_updates(p, updates), state, loss

    # --8<-- [end:training]

    # --8<-- [start:starts]
    # Starting points (threshold dB, ratio, attack ms, release ms), stacked.
    starts = [(-10.0, 2.0, 2.0, 50.0), (-35.0, 1.5, 30.0, 400.0)]
    if not smoke:
        starts += [(-15.0, 8.0, 20.0, 80.0)]
    p = jnp.stack([unknowns(*s) for s in starts])
    # optax's L-BFGS state holds weakly typed scalars, which turn strong after
    # one step: make them strong now, so that `step` compiles once, not twice.
    state = jax.tree.map(lambda v: jnp.asarray(v, v.dtype), jax.vmap(optimizer.init)(p))
    # --8<-- [end:starts]
    p_initial = p

    losses = []
    start = time.perf_counter()
    for i in range(steps):
        p, state, loss = step(p, state)
        losses.append(np.asarray(loss))
        if i % max(steps // 5, 1) == 0:
            print(f"iteration {i:3d}  loss per start (dB^2) {np.asarray(loss)}")
    elapsed = time.perf_counter() - start
    final = jax.jit(jax.vmap(loss_fn))(p)
    best = int(jnp.argmin(final))
    fitted = with_unknowns(p[best])
    initial = [settings(with_unknowns(p_initial[i])) for i in range(len(starts))]

    truth, found = settings(true_comp), settings(fitted)
    errors = {k: abs(found[k] / truth[k] - 1) for k in truth}
    print(
        f"\n{steps} L-BFGS iterations, {len(starts)} starts at once, {length} samples"
    )
    print(f"in {elapsed:.2f} s; best start {best}, loss {float(final[best]):.2e} dB^2")
    for k in truth:
        print(
            f"{k:13s} true {truth[k]:8.3f}  recovered {found[k]:8.3f}  "
            f"(relative error {errors[k]:.1e})"
        )

    OUTPUTS.mkdir(exist_ok=True)
    peak = float(jnp.max(jnp.abs(x)))
    write_wav(OUTPUTS / "compressor_dry.wav", x, sample_rate, peak)
    write_wav(OUTPUTS / "compressor_target.wav", target, sample_rate, peak)
    write_wav(OUTPUTS / "compressor_fitted.wav", fitted(x), sample_rate, peak)
    if plot is not None:
        save_plot(plot, losses, x, true_comp, fitted, sample_rate)
    return {
        "losses": np.asarray(losses),
        "initial": initial,
        "final_losses": np.asarray(final),
        "truth": truth,
        "recovered": found,
        "errors": errors,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--plot", metavar="PATH", help="save a PNG of the fit")
    args = parser.parse_args()
    main(args.smoke, args.plot)
