"""Fit the readout of a modal state-space filter: a convex least-squares problem.

A `StateSpaceFilter` with eight damped modes at the inharmonic ratios of a
struck bar (a marimba-like resonator body) rings after mallet strikes. With the
modes (poles and input weights) known, the output is linear in the readout:
the complex output weights `c` and the feedthrough `d`. Fitting them to the
target audio is linear least squares, with one exact answer, and it is solved
here two ways:

1. **direct**: lineax's QR on the filter as a linear operator. Lineax builds
   the design matrix by forward-mode differentiation (`jax.jacfwd`) of the
   filter, which the recurrence core's `custom_jvp` rule supports;
2. **by gradients**: optax's L-BFGS on the squared error, where every gradient
   runs the adjoint filter backwards in time.

Both run in float64, and the direct solve is repeated in float32 to show what
single precision gives.

Run: `python examples/parameter_estimation/fit_state_space_filter.py` (add
`--smoke` for a few-second check and `--plot PATH` to save a PNG). Target and
fitted audio go to `examples/outputs/` as WAV files.
"""

import argparse
import pathlib
import time
import wave

import jax


jax.config.update("jax_enable_x64", True)

import equinox as eqx  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import lineax as lx  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from retrax.filters import StateSpaceFilter  # noqa: E402


OUTPUTS = pathlib.Path(__file__).resolve().parent.parent / "outputs"


def mallet_strikes(length, sample_rate, seed=0):
    """Short raised-cosine mallet pulses at irregular times and loudness."""
    rng = np.random.default_rng(seed)
    x = np.zeros(length)
    width = int(0.0002 * sample_rate)
    pulse = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(width) / width)
    t = 0
    while t + width < length:
        x[t : t + width] += rng.uniform(0.3, 1.0) * pulse
        t += int(rng.uniform(0.08, 0.3) * sample_rate)
    return x


def write_wav(path, signal, sample_rate, peak):
    """16-bit mono WAV, scaled by `peak` (shared between files, for comparison)."""
    pcm = np.clip(np.asarray(signal) / peak, -1, 1)
    with wave.open(str(path), "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(sample_rate)
        f.writeframes((pcm * 32767).astype("<i2").tobytes())
    print(f"wrote {path.relative_to(OUTPUTS.parent.parent)}")


def bar_resonator(sample_rate, key):
    """The unknown filter: eight modes of a free bar tuned to 220 Hz."""
    ratios = jnp.asarray([1.0, 2.756, 5.404, 8.933, 13.34, 18.64, 24.81, 31.87])
    freqs = 220.0 * ratios
    t60 = 1.2 / ratios**0.7  # higher modes die away faster
    radius = 10.0 ** (-3.0 / (t60 * sample_rate))
    filt = StateSpaceFilter(n_modes=8, key=key, max_radius=0.99999)
    k1, k2 = jax.random.split(jax.random.fold_in(key, 1))
    b = jnp.stack([jnp.ones(8), jnp.zeros(8)], -1)
    c = jax.random.normal(k1, (8, 2)) / ratios[:, None] * 0.05
    return eqx.tree_at(
        lambda m: (m.raw_radius, m.angle, m.b, m.c, m.d),
        filt,
        (
            jnp.log(radius / filt.max_radius) - jnp.log1p(-radius / filt.max_radius),
            2 * jnp.pi * freqs / sample_rate,
            b,
            c,
            0.1 * jax.random.normal(k2, ()),
        ),
    )


def save_plot(path, t, x, target, fitted, lbfgs_losses):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
    left.semilogy(lbfgs_losses)
    left.set_xlabel("L-BFGS iteration")
    left.set_ylabel("relative loss")
    left.set_title("Gradient-based fit (float64)")
    stop = min(len(t), int(0.3 * len(t)))
    right.plot(t[:stop], target[:stop], color="C0", lw=1, label="target")
    right.plot(t[:stop], fitted[:stop], "--", color="C1", lw=1, label="fitted (QR)")
    right.plot(t[:stop], x[:stop] * 0.2, color="0.6", lw=0.8, label="strikes x 0.2")
    right.set_xlabel("time (s)")
    right.set_title("Resonator output")
    right.legend(loc="upper right", fontsize="small")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")


def main(smoke: bool = False, plot: str | None = None) -> dict:
    sample_rate = 44_100
    length = sample_rate // 4 if smoke else sample_rate
    iterations = 40 if smoke else 100
    x = jnp.asarray(mallet_strikes(length, sample_rate))
    true_filter = bar_resonator(sample_rate, jax.random.key(0))
    target = eqx.filter_jit(lambda m, x: m(x))(true_filter, x)

    # --8<-- [start:operator]
    # The modes are known; the readout (c, d) is not. The start: all zeros.
    modes = eqx.tree_at(
        lambda m: (m.c, m.d), true_filter, (jnp.zeros((8, 2)), jnp.zeros(()))
    )
    readout0 = (modes.c, modes.d)

    def readout_to_audio(readout, modes, x):
        """A linear function of the readout: the filter's output."""
        return eqx.tree_at(lambda m: (m.c, m.d), modes, readout)(x)

    # --8<-- [end:operator]

    # --8<-- [start:direct]
    @eqx.filter_jit
    def direct_solve(modes, x, target):
        operator = lx.FunctionLinearOperator(
            lambda readout: readout_to_audio(readout, modes, x),
            jax.eval_shape(lambda: (modes.c, modes.d)),
        )
        return lx.linear_solve(operator, target, solver=lx.QR()).value

    start = time.perf_counter()
    c_qr, d_qr = jax.block_until_ready(direct_solve(modes, x, target))
    qr_seconds = time.perf_counter() - start
    # --8<-- [end:direct]

    # --8<-- [start:lbfgs]
    def loss_fn(readout):
        misfit = readout_to_audio(readout, modes, x) - target
        return jnp.sum(misfit**2) / jnp.sum(target**2)

    optimizer = optax.lbfgs()
    # optax's L-BFGS state holds weakly typed scalars, which turn strong after
    # one step: make them strong now, so that `step` compiles once, not twice.
    state = jax.tree.map(lambda v: jnp.asarray(v, v.dtype), optimizer.init(readout0))
    value_and_grad = optax.value_and_grad_from_state(loss_fn)

    @jax.jit
    def step(readout, state):
        loss, grad = value_and_grad(readout, state=state)
        updates, state = optimizer.update(
            grad, state, readout, value=loss, grad=grad, value_fn=loss_fn
        )
        return optax.apply_updates(readout, updates), state, loss

    # --8<-- [end:lbfgs]

    readout = readout0
    losses = []
    start = time.perf_counter()
    for _ in range(iterations):
        readout, state, loss = step(readout, state)
        losses.append(float(loss))
    c_gd, d_gd = readout
    lbfgs_seconds = time.perf_counter() - start

    # The same direct solve in float32.
    to32 = lambda v: v.astype(jnp.float32) if eqx.is_inexact_array(v) else v
    c_32, d_32 = direct_solve(*jax.tree.map(to32, (modes, x, target)))

    c_true, d_true = true_filter.c, true_filter.d

    def error(c, d):
        """Largest readout error relative to the largest true readout weight."""
        scale = jnp.maximum(jnp.max(jnp.abs(c_true)), jnp.abs(d_true))
        worst = jnp.maximum(jnp.max(jnp.abs(c - c_true)), jnp.abs(d - d_true))
        return float(worst / scale)

    errors = {
        "qr": error(c_qr, d_qr),
        "lbfgs": error(c_gd, d_gd),
        "qr_float32": error(c_32.astype(jnp.float64), d_32.astype(jnp.float64)),
    }
    fitted = readout_to_audio((c_qr, d_qr), modes, x)
    misfit = float(jnp.sqrt(jnp.sum((fitted - target) ** 2) / jnp.sum(target**2)))
    print(f"{length} samples, 8 modes, readout = 8 complex weights + feedthrough")
    print(f"true d {float(d_true):+.6f}, c[0] {np.asarray(c_true[0])}")
    print(f"QR     d {float(d_qr):+.6f}, c[0] {np.asarray(c_qr[0])}")
    print(
        f"direct QR solve (float64):   relative readout error {errors['qr']:.1e}"
        f"  ({qr_seconds:.2f} s, including compilation)"
    )
    print(
        f"L-BFGS, {iterations} iterations (float64): relative readout error "
        f"{errors['lbfgs']:.1e}, relative loss {losses[-1]:.1e} "
        f"({lbfgs_seconds:.2f} s)"
    )
    print(
        "direct QR solve (float32):   relative readout error "
        f"{errors['qr_float32']:.1e}"
    )
    print(f"relative audio misfit of the QR fit {misfit:.1e}")

    OUTPUTS.mkdir(exist_ok=True)
    peak = float(jnp.max(jnp.abs(target)))
    write_wav(OUTPUTS / "state_space_target.wav", target, sample_rate, peak)
    write_wav(OUTPUTS / "state_space_fitted.wav", fitted, sample_rate, peak)
    if plot is not None:
        t = np.arange(length) / sample_rate
        save_plot(
            plot, t, np.asarray(x), np.asarray(target), np.asarray(fitted), losses
        )
    return {"errors": errors, "losses": losses, "misfit": misfit}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--plot", metavar="PATH", help="save a PNG of the fit")
    args = parser.parse_args()
    main(args.smoke, args.plot)
