"""Fit a whole effect chain to audio processed by the same chain, then stream it.

A synthesised drum loop (kicks, snares and hi-hats at random velocities,
1.02 s at 16 kHz, fixed seeds) goes through a channel strip with hidden
settings: a three-band `ParametricEQ`, a `Compressor`, a tanh `Distortion`,
a `FeedbackDelay` and an `FDNReverb`, composed by `retrax.effects.Chain`.
Knowing the dry loop and the processed result, Adam (optax) fits a second
chain of the same structure with auraloss's multi-resolution STFT loss
(`retrax.losses.MultiResolutionSTFTLoss`, its defaults).

The fit sees the chain only through the processor interface: the chain's
`n_params` normalised parameters in $[0, 1]$ (`to_normalised()`,
`with_normalised(p)`), every effect's parameters concatenated in order.
Adam trains an unconstrained vector $\\theta$ and the chain gets
$p = \\operatorname{sigmoid}(\\theta)$, so every step stays inside the
documented ranges. The start is the target's normalised vector moved by up
to 0.15 in every entry (uniform, fixed seed). Each gradient runs the
recursions' adjoint filters backwards in time; no loop is unrolled.

The compressor's makeup gain and the distortion's drive that follows it act
only through their product (the distortion sees `drive * makeup * x`), so
the output determines their sum in dB, not each of them; the script reports
both and the sum. It reports every parameter against the truth and checks
the gains (the EQ band gains, makeup + drive, the delay's feedback and mix,
the reverb's mix) and the reverb's decay time (its low-frequency T60).

Last, the fitted chain runs as a real-time audio callback would: block by
block, each block's final state (`return_zf=True`) the next block's `zi`.
The stitched blocks equal one call on the whole signal; the script prints
the largest difference and the median time per block against the block's
real-time budget.

Run: `python examples/fit_chain.py` (add `--smoke` for a short check and
`--plot PATH` to save a PNG).
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from retrax.effects import Chain, Distortion, FDNReverb, FeedbackDelay
from retrax.filters import Compressor, ParametricEQ
from retrax.losses import MultiResolutionSTFTLoss


SAMPLE_RATE = 16_000
START_OFFSET = 0.15  # the start's largest distance from the target, normalised
BLOCK = 512  # the streaming block, 32 ms at 16 kHz
# The gains that the 5% claim covers (labels of `parameter_table`), and the
# reverb's decay time. The makeup and the drive count as their sum.
GAINS = (
    "ParametricEQ.gains_db[0]",
    "ParametricEQ.gains_db[1]",
    "ParametricEQ.gains_db[2]",
    "Compressor.makeup_db + Distortion.drive_db",
    "FeedbackDelay.feedback",
    "FeedbackDelay.mix",
    "FDNReverb.mix",
)
DECAY_TIME = "FDNReverb.t60"


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
        hit = pattern.get(i % 16, hat)
        x[start : start + t.shape[0]] += rng.uniform(0.3, 1.0) * hit()
    x = x[:length]
    return 0.9 * x / np.max(np.abs(x))


# --8<-- [start:target]
def hidden_chain():
    """The chain that made the target: a channel strip with settings to find."""
    return Chain(
        [
            ParametricEQ(  # low shelf, one peak, high shelf
                [60.0, 400.0, 3000.0], [5.0, -6.0, 4.0], [0.7, 1.4, 0.7],
                sample_rate=SAMPLE_RATE,
                ordered=True,  # one normalised band per section, in order
            ),
            Compressor(
                threshold_db=-20.0, ratio=4.0, attack_ms=5.0, release_ms=80.0,
                makeup_db=6.0, sample_rate=SAMPLE_RATE,
            ),
            Distortion(drive_db=9.0),
            FeedbackDelay(feedback=0.4, mix=0.3, delay_samples=2400),  # 150 ms
            FDNReverb(  # four lines of 7 to 16 ms: a small room
                t60=0.8, hf_ratio=0.5, mix=0.25, delays=(113, 151, 199, 263),
                sample_rate=SAMPLE_RATE,
            ),
        ]
    )  # fmt: skip


# --8<-- [end:target]


def parameter_table(chain, p):
    """The physical value of every entry of the normalised vector `p`, by
    label, through each effect's documented ranges (`effect.ranges()`), and
    the sum of the makeup and the drive (in dB), which the output determines."""
    rows, start = [], 0
    for effect in chain.effects:
        name = type(effect).__name__
        entries = []
        for key, r in effect.ranges().items():
            size = int(np.size(getattr(effect, key))) if hasattr(effect, key) else 1
            labels = [key] if size == 1 else [f"{key}[{i}]" for i in range(size)]
            entries.extend((f"{name}.{label}", r) for label in labels)
        if len(entries) != effect.n_params:
            raise ValueError(
                f"{name}'s ranges() do not label its {effect.n_params} normalised "
                "parameters one by one."
            )
        for label, r in entries:
            rows.append((label, float(r.physical(p[start]))))
            start += 1
    table = dict(rows)
    makeup, drive = "Compressor.makeup_db", "Distortion.drive_db"
    table[f"{makeup} + {drive}"] = table[makeup] + table[drive]
    return table


def report(truth, start, fitted):
    print(f"{'parameter':44s} {'truth':>9s} {'start':>9s} {'fitted':>9s}   error")
    errors = {}
    for label in truth:
        claim = "*" if label in GAINS or label == DECAY_TIME else " "
        if truth[label] == 0:  # no relative error: the difference instead
            errors[label] = fitted[label] - truth[label]
            error = f"{errors[label]:+8.3g} {claim}"
        else:
            errors[label] = fitted[label] / truth[label] - 1
            error = f"{100 * errors[label]:+7.2f}% {claim}"
        print(
            f"{label:44s} {truth[label]:9.4g} {start[label]:9.4g} "
            f"{fitted[label]:9.4g} {error}"
        )
    print("(* the gains and the decay time; relative errors of the values, or")
    print("  differences where the truth is 0)")
    return errors


def save_plot(path, losses, distances, labels, block_ms, budget_ms):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), layout="constrained")
    axes[0].semilogy(losses)
    axes[0].set_xlabel("Adam step")
    axes[0].set_ylabel("multi-resolution STFT loss")
    axes[0].set_title("Training loss")
    distances = np.abs(np.asarray(distances))
    degenerate = ("Compressor.makeup_db", "Distortion.drive_db")
    for i, label in enumerate(labels):
        if label in degenerate:
            axes[1].semilogy(distances[:, i], lw=1.5, label=label)
        else:
            axes[1].semilogy(distances[:, i], color="0.6", lw=0.7)
    axes[1].set_ylim(1e-5, 0.3)
    axes[1].set_xlabel("Adam step")
    axes[1].set_ylabel("|p - p_target| (normalised)")
    axes[1].set_title("Every parameter (grey) and the makeup/drive pair")
    axes[1].legend(fontsize=7, loc="lower left")
    axes[2].semilogy(np.arange(2, 2 + len(block_ms)), block_ms, "o", ms=3,
                     color="C2", label="one block")  # fmt: skip
    axes[2].axhline(budget_ms, color="k", ls="--", label="real-time budget")
    axes[2].set_xlabel("block (the first two compile)")
    axes[2].set_ylabel("time (ms)")
    axes[2].set_title(f"Streaming the fitted chain, {BLOCK}-sample blocks")
    axes[2].legend(fontsize=7)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")


# --8<-- [start:stream]
def stream(chain, x, block):
    """`chain` on `x` block by block, each block's final state the next's `zi`;
    returns the stitched output and the seconds each block took."""
    process = jax.jit(lambda c, xb, zi: c(xb, zi=zi, return_zf=True))
    state = None  # silence before the signal
    ys, seconds = [], []
    for lo in range(0, x.shape[0], block):
        start = time.perf_counter()
        y, state = process(chain, x[lo : lo + block], state)
        y = jax.block_until_ready(y)
        seconds.append(time.perf_counter() - start)
        ys.append(y)
    return jnp.concatenate(ys), np.asarray(seconds)


# --8<-- [end:stream]


# --8<-- [start:float64]
def float64_errors(chain, x, whole, blocks):
    """The largest errors of the float32 outputs `whole` (one call) and
    `blocks` against the same chain and input in float64."""
    with jax.enable_x64(True):
        wide = jax.tree.map(lambda a: a.astype(float), chain)
        reference = np.asarray(jax.jit(lambda c: c(x.astype(float)))(wide))
    return tuple(
        float(np.max(np.abs(np.asarray(y, np.float64) - reference)))
        for y in (whole, blocks)
    )


# --8<-- [end:float64]


def main(smoke: bool = False, plot: str | None = None) -> dict:
    length = 8 * BLOCK if smoke else 32 * BLOCK  # 0.26 s or 1.02 s
    steps = 20 if smoke else 300
    x = jnp.asarray(drum_loop(length, SAMPLE_RATE), jnp.float32)
    template = hidden_chain()

    # --8<-- [start:fit]
    one_call = jax.jit(lambda chain: chain(x))
    target = one_call(template)
    p_target = template.to_normalised()
    rng = np.random.default_rng(1)
    offset = rng.uniform(-START_OFFSET, START_OFFSET, template.n_params)
    p_start = jnp.clip(p_target + offset, 0.01, 0.99).astype(jnp.float32)
    stft_loss = MultiResolutionSTFTLoss()  # auraloss's defaults

    def loss_fn(theta):
        chain = template.with_normalised(jax.nn.sigmoid(theta))
        return stft_loss(chain(x), target)

    optimizer = optax.adam(optax.cosine_decay_schedule(0.03, steps, 0.05))

    @jax.jit
    def step(theta, state):
        loss, grad = jax.value_and_grad(loss_fn)(theta)
        updates, state = optimizer.update(grad, state)
        return optax.apply_updates(theta, updates), state, loss

    theta = jnp.log(p_start / (1 - p_start))  # sigmoid(theta) = p_start
    state = optimizer.init(theta)
    # --8<-- [end:fit]
    start_offset = float(jnp.max(jnp.abs(p_start - p_target)))
    print(f"{template.n_params} normalised parameters, the start within "
          f"{start_offset:.3f} of the target's")  # fmt: skip
    losses, distances = [], []
    began = time.perf_counter()
    for i in range(steps):
        distances.append(np.asarray(jax.nn.sigmoid(theta) - p_target))
        theta, state, loss = step(theta, state)
        losses.append(float(loss))
        if i % max(steps // 6, 1) == 0 or i == steps - 1:
            print(f"step {i:4d}  STFT loss {losses[-1]:.4g}")
    elapsed = time.perf_counter() - began
    p_fit = jax.nn.sigmoid(theta)
    final_loss = float(step(theta, state)[2])  # the loss at p_fit
    reduction = losses[0] / final_loss
    print(f"{steps} Adam steps in {elapsed:.1f} s (including compilation)")
    print(f"STFT loss {losses[0]:.4g} -> {final_loss:.4g}: {reduction:.0f}x lower\n")

    truth = parameter_table(template, p_target)
    errors = report(
        truth, parameter_table(template, p_start), parameter_table(template, p_fit)
    )
    claimed = {k: errors[k] for k in (*GAINS, DECAY_TIME)}
    worst = max(claimed, key=lambda k: abs(claimed[k]))
    print(f"largest error of the gains and the decay time: "
          f"{100 * abs(claimed[worst]):.2f}% ({worst})\n")  # fmt: skip

    # --8<-- [start:streaming]
    fitted = template.with_normalised(p_fit)
    whole = one_call(fitted)
    blocks, seconds = stream(fitted, x, BLOCK)
    difference = float(jnp.max(jnp.abs(blocks - whole)))
    # --8<-- [end:streaming]
    peak = float(jnp.max(jnp.abs(whole)))
    print(f"streaming the fitted chain: {len(seconds)} blocks of {BLOCK} samples, "
          f"max |y| {peak:.3g}")  # fmt: skip
    print(f"max |blocks - one call|            {difference:.2g}")
    errors_one_call = errors_blocks = None
    if not smoke:  # (a compilation the smoke run saves)
        errors_one_call, errors_blocks = float64_errors(fitted, x, whole, blocks)
        print(f"max |one call - float64 one call|  {errors_one_call:.2g}")
        print(f"max |blocks - float64 one call|    {errors_blocks:.2g}")
    # the first two blocks compile (no state, then a state)
    median_ms = 1e3 * float(np.median(seconds[2:]))
    budget_ms = 1e3 * BLOCK / SAMPLE_RATE
    print(f"median time per block {median_ms:.2f} ms of a {budget_ms:.0f} ms "
          f"budget ({budget_ms / median_ms:.0f}x faster than real time)")  # fmt: skip

    if plot is not None:
        save_plot(plot, losses, distances, list(truth)[: template.n_params],
                  1e3 * seconds[2:], budget_ms)  # fmt: skip
    return {
        "losses": losses,
        "final_loss": final_loss,
        "reduction": reduction,
        "start_offset": start_offset,
        "truth": truth,
        "errors": errors,
        "claimed_errors": claimed,
        "stream_difference": difference,
        "one_call_float32_error": errors_one_call,
        "blocks_float32_error": errors_blocks,
        "output_peak": peak,
        "stream_shape": list(blocks.shape),
        "median_block_ms": median_ms,
        "budget_ms": budget_ms,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--plot", metavar="PATH", help="save a PNG")
    args = parser.parse_args()
    main(smoke=args.smoke, plot=args.plot)
