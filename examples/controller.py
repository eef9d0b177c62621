"""Train a controller: a network that hears audio and sets an effect chain.

A dasp-style controller (Steinmetz et al., "Style transfer of audio effects
with differentiable signal processing", JAES 2022): a small network looks at
a dry signal and the same signal after an effect chain with unknown
settings, and predicts the chain's normalised parameters, the vector of
`Chain.with_normalised` in $[0, 1]$. It is trained with no parameter labels:
its prediction drives a copy of the chain on the dry signal, and the loss is
auraloss's multi-resolution STFT loss between that output and the wet
signal (`retrax.losses.MultiResolutionSTFTLoss`, its defaults), so the
gradient runs through the chain's recursions, each by its adjoint filter
backwards in time.

The chain is a resonant lowpass `SVF` (cutoff and Q) followed by a `Gain`:
three parameters, each heard in the spectrum. The data are synthetic
(nothing is downloaded): each example is a few harmonic tones with random
pitches and a little noise, processed with parameters drawn uniformly in
$[0, 1]$. The features are, per log-spaced band, the dry signal's level and
the wet signal's gain over it (an estimate of the chain's magnitude
response). A batch is one `jax.vmap` over examples, a training step one
jitted program (optax's Adam).

The script reports, on held-out examples, the mean absolute error of the
predicted normalised parameters against the truth, next to the error of
always predicting the middle of every range (0.5), the best constant guess
under a uniform prior (0.25 on average), and shows a progress bar (tqdm).

Run: `python examples/controller.py` (add `--smoke` for a short check and
`--plot PATH` to save a PNG of the loss and the parameter errors).
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from retrax.effects import SVF, Chain, Gain
from retrax.losses import MultiResolutionSTFTLoss


SAMPLE_RATE = 16_000
LENGTH = 4096  # 0.26 s
BANDS = 40
NAMES = ("SVF.cutoff", "SVF.q", "Gain.gain_db")

# --8<-- [start:chain]
CHAIN = Chain(
    [
        SVF(1000.0, sample_rate=SAMPLE_RATE, mode="lowpass"),
        Gain(),
    ]
)
LOSS = MultiResolutionSTFTLoss()
# --8<-- [end:chain]


def dry_signals(key, count):
    """`count` dry examples: two or three harmonic tones with random pitches
    (55-880 Hz), levels and decays, plus a little noise."""

    def one(key):
        k_f, k_a, k_d, k_n, k_on = jax.random.split(key, 5)
        t = jnp.arange(LENGTH) / SAMPLE_RATE
        f0 = 55.0 * 2.0 ** jax.random.uniform(k_f, (3,), maxval=4.0)
        level = jax.random.uniform(k_a, (3,), minval=0.05, maxval=0.3)
        level = level * (jax.random.uniform(k_on, (3,)) < 0.8)
        decay = jax.random.uniform(k_d, (3,), minval=2.0, maxval=12.0)
        harmonics = jnp.arange(1, 9)
        phase = 2 * jnp.pi * f0[:, None, None] * harmonics[None, :, None] * t
        partials = jnp.sin(phase) / harmonics[None, :, None]
        tones = jnp.sum(partials, axis=1) * jnp.exp(-decay[:, None] * t)
        x = jnp.sum(level[:, None] * tones, axis=0)
        return x + 0.03 * jax.random.normal(k_n, (LENGTH,))

    return jax.vmap(one)(jax.random.split(key, count))


# --8<-- [start:features]
EDGES = np.geomspace(40.0, SAMPLE_RATE / 2, BANDS + 1)
FREQS = np.fft.rfftfreq(LENGTH, 1 / SAMPLE_RATE)
# (bands, bins): which bins each band sums
BAND_MATRIX = jnp.asarray(
    (FREQS[None, :] >= EDGES[:-1, None]) & (FREQS[None, :] < EDGES[1:, None]),
    jnp.float32,
)


def features(dry, wet):
    """Per band, the log energy of the dry signal and the wet signal's gain
    over it (an estimate of the chain's magnitude response), `(2 * BANDS,)`."""

    def bands(x):
        power = jnp.abs(jnp.fft.rfft(x * jnp.hanning(LENGTH))) ** 2
        return jnp.log10(BAND_MATRIX @ power + 1e-6)

    level = bands(dry)
    return jnp.concatenate([level / 4.0, bands(wet) - level])


class Controller(eqx.Module):
    """An MLP from features to normalised parameters (a sigmoid output)."""

    mlp: eqx.nn.MLP

    def __init__(self, key):
        self.mlp = eqx.nn.MLP(2 * BANDS, CHAIN.n_params, 64, 2, key=key)

    def __call__(self, dry, wet):
        return jax.nn.sigmoid(self.mlp(features(dry, wet)))


# --8<-- [end:features]


def make_data(key, count):
    """Dry examples, their true normalised parameters and the wet signals."""
    k_x, k_p = jax.random.split(key)
    dry = dry_signals(k_x, count)
    params = jax.random.uniform(k_p, (count, CHAIN.n_params))
    wet = jax.vmap(lambda p, x: CHAIN.with_normalised(p)(x))(params, dry)
    return dry, params, wet


# --8<-- [start:training]
def batch_loss(controller, dry, wet):
    """The mean multi-resolution STFT loss of the controlled chain's outputs."""

    def one(x, y):
        p = controller(x, y)
        return LOSS(CHAIN.with_normalised(p)(x), y)

    return jnp.mean(jax.vmap(one)(dry, wet))


OPTIMIZER = optax.adam(3e-3)


@eqx.filter_jit
def train_step(controller, opt_state, dry, wet):
    loss, grads = eqx.filter_value_and_grad(batch_loss)(controller, dry, wet)
    updates, opt_state = OPTIMIZER.update(grads, opt_state, controller)
    return eqx.apply_updates(controller, updates), opt_state, loss


@eqx.filter_jit
def parameter_errors(controller, dry, params, wet):
    """Per parameter, the held-out mean absolute error in normalised units."""
    predicted = jax.vmap(controller)(dry, wet)
    return jnp.mean(jnp.abs(predicted - params), axis=0)


# --8<-- [end:training]


def train(key, steps, train_count, test_count, batch, evaluate_every):
    k_train, k_test, k_init, k_batches = jax.random.split(key, 4)
    dry, params, wet = make_data(k_train, train_count)
    test = make_data(k_test, test_count)
    controller = Controller(k_init)
    opt_state = OPTIMIZER.init(eqx.filter(controller, eqx.is_inexact_array))
    losses, evaluations = [], []
    with tqdm(total=steps, desc="controller", unit="step") as bar:
        for step in range(steps):
            idx = jax.random.choice(
                jax.random.fold_in(k_batches, step), train_count, (batch,), False
            )
            controller, opt_state, loss = train_step(
                controller, opt_state, dry[idx], wet[idx]
            )
            losses.append(float(loss))
            if step % evaluate_every == 0 or step == steps - 1:
                errors = parameter_errors(controller, *test)
                evaluations.append((step, np.asarray(errors)))
            bar.update(1)
            if step % 10 == 0:
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return controller, np.asarray(losses), evaluations, test


def main(smoke: bool = False, plot: str | None = None, seed: int = 0) -> dict:
    if smoke:
        steps, train_count, test_count, batch = 600, 256, 64, 16
    else:
        steps, train_count, test_count, batch = 2000, 1024, 256, 32
    start = time.perf_counter()
    controller, losses, evaluations, test = train(
        jax.random.key(seed), steps, train_count, test_count, batch, 50
    )
    seconds = time.perf_counter() - start
    final = evaluations[-1][1]
    baseline = np.asarray(jnp.mean(jnp.abs(test[1] - 0.5), axis=0))
    print(f"{steps} steps of batch {batch} in {seconds:.1f} s (compilation included)")
    print(f"multi-resolution STFT loss: {losses[0]:.3f} -> {np.mean(losses[-20:]):.3f}")
    print(f"held-out parameter error ({test_count} examples, normalised units):")
    print(f"  {'parameter':<22}{'controller':>12}{'predict 0.5':>13}")
    for name, e, b in zip(NAMES, final, baseline, strict=True):
        print(f"  {name:<22}{e:>12.3f}{b:>13.3f}")
    mean, mean_base = float(np.mean(final)), float(np.mean(baseline))
    print(f"  {'mean':<22}{mean:>12.3f}{mean_base:>13.3f}")
    print(f"ratio to the baseline: {mean / mean_base:.2f}")
    if plot:
        save_plot(plot, losses, evaluations, baseline)
    return {
        "losses": losses,
        "errors": final,
        "baseline": baseline,
        "ratio": mean / mean_base,
        "evaluations": evaluations,
    }


def save_plot(path, losses, evaluations, baseline):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.5))
    left.plot(losses, lw=0.6)
    left.set(xlabel="step", ylabel="MR-STFT loss", title="training loss")
    steps = [s for s, _ in evaluations]
    errors = np.stack([e for _, e in evaluations])
    for i, name in enumerate(NAMES):
        (line,) = right.plot(steps, errors[:, i], label=name)
        right.axhline(baseline[i], color=line.get_color(), ls=":", lw=0.8)
    right.set(
        xlabel="step",
        ylabel="mean |error| (normalised)",
        title="held-out parameter error (dotted: predict 0.5)",
    )
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot: {path}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--plot", default=None, help="save a PNG here")
    args = parser.parse_args()
    main(smoke=args.smoke, plot=args.plot)
