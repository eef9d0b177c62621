"""Time retrax against batch size and signal length: where batching stops being free.

Cases, all float32 at 44.1 kHz:

- `allpole`, order 2, time-varying coefficients (the case of `bench_ops.py`),
  forward and forward + gradient (with respect to x, a and zi), with the
  sequential and the associative method of the recurrence core;
- `lfilter`, when `retrax.ops.lfilter` exists (skipped with a note if not);
- the six-operator FM voice of `examples/fm_voices.py`, forward.

Batch sizes 1 to 1,024 (`jax.vmap`) at 0.1 s, and lengths 0.1 s to 10 s for
one signal. Writes a PNG plot and a markdown table, and names for every series
the batch size where the cost of a call stops being flat (more than twice the
cost of one signal).

Run: `python benchmarks/bench_scaling.py [--out docs/assets] [--quick]`
"""

import argparse
import functools
import os
import pathlib
import sys
import time


sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from _harness import Case, repeated_medians_ms  # noqa: E402
from bench_ops import jax_case  # noqa: E402
from plot_scaling import machine_line  # noqa: E402

import retrax.ops  # noqa: E402
from retrax.ops import allpole  # noqa: E402


SAMPLE_RATE = 44_100
BATCHES = (1, 4, 16, 64, 256, 1024)
SECONDS = (0.1, 1.0, 10.0)
BATCH_SECONDS = 0.1
FLAT = 2.0  # "flat" while a batch costs less than FLAT times one signal


def time_fn(fn, budget_s: float) -> float:
    """The fastest of three medians of one call, with calls fitting `budget_s`.

    The minimum over repeats, not the median: this CPU is shared, and the
    question is what the code costs, not how busy the machine was.
    """
    return min(repeated_medians_ms(fn, budget_s))


def allpole_case(method, batch, length, mode):
    filt = functools.partial(allpole, method=method)
    return jax_case(filt, Case("", {"B": batch, "T": length, "mode": mode}))


def lfilter_case(batch, length, mode):
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((batch, length)), jnp.float32)
    b = jnp.asarray([0.2, 0.4, 0.2], jnp.float32)
    a = jnp.asarray([1.0, -0.5, 0.3], jnp.float32)

    def f(x, b, a):
        return retrax.ops.lfilter(b, a, x, axis=-1)

    if mode == "fwd":
        g = jax.jit(f)
    else:
        g = jax.jit(jax.grad(lambda *args: jnp.sum(f(*args) ** 2), argnums=(0, 1, 2)))
    return lambda: jax.block_until_ready(g(x, b, a))


def fm_case(batch, length, mode):
    import fm_voices

    patch = fm_voices.electric_piano()
    notes = np.arange(batch) % 60 + 36
    note_hz = jnp.asarray(440.0 * 2 ** ((notes - 69) / 12), jnp.float32)
    velocity = jnp.full(batch, 0.8, jnp.float32)
    render = jax.jit(jax.vmap(lambda f, v: fm_voices.voice(patch, f, v, length)))
    return lambda: jax.block_until_ready(render(note_hz, velocity))


def knee(rows):
    """The first batch size whose call costs more than FLAT times B = 1's."""
    base = rows[0]["ms"]
    for r in rows:
        if r["ms"] > FLAT * base:
            return r["B"]
    return None


def batch_table(series):
    names = list(series)
    head = "| B | " + " | ".join(f"{n} ms" for n in names) + " |"
    lines = [head, "|---:|" + "---:|" * len(names)]
    batches = sorted({r["B"] for rows in series.values() for r in rows})
    for b in batches:
        cells = [str(b)]
        for n in names:
            row = next((r for r in series[n] if r["B"] == b), None)
            if row is None:
                cells.append("-")
            else:
                per = row["ms"] / series[n][0]["ms"]
                cells.append(f"{row['ms']:.3f} ({per:.1f}x)")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def length_table(series):
    names = list(series)
    head = "| length | " + " | ".join(f"{n} ms" for n in names) + " |"
    lines = [head, "|---:|" + "---:|" * len(names)]
    for i, r0 in enumerate(next(iter(series.values()))):
        cells = [f"{r0['seconds']:g} s"]
        cells += [f"{series[n][i]['ms']:.3f}" for n in names]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(path, by_batch, by_length):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    for name, rows in by_batch.items():
        left.loglog([r["B"] for r in rows], [r["ms"] for r in rows], "o-", label=name)
    left.set_xlabel(f"batch size B ({BATCH_SECONDS:g} s signals, jax.vmap)")
    left.set_ylabel("ms per call")
    left.set_xticks(BATCHES, [str(b) for b in BATCHES])
    left.minorticks_off()
    left.grid(True, alpha=0.3)
    left.legend(fontsize="small")
    for name, rows in by_length.items():
        right.loglog(
            [r["seconds"] for r in rows], [r["ms"] for r in rows], "s-", label=name
        )
    right.set_xlabel("signal length in s (B = 1)")
    right.set_ylabel("ms per call")
    right.grid(True, alpha=0.3)
    right.legend(fontsize="small")
    fig.suptitle("retrax on CPU: batch size and signal length (float32, 44.1 kHz)")
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/assets", help="output folder")
    parser.add_argument("--quick", action="store_true", help="a few cases only")
    parser.add_argument("--budget", type=float, default=0.3, help="s per case")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    batches = BATCHES[:3] if args.quick else BATCHES
    seconds = SECONDS[:2] if args.quick else SECONDS
    notes = []
    makers = {
        "allpole fwd": functools.partial(allpole_case, "sequential", mode="fwd"),
        "allpole fwd+grad": functools.partial(allpole_case, "sequential", mode="grad"),
        "allpole assoc. fwd": functools.partial(
            allpole_case, "associative", mode="fwd"
        ),
        "allpole assoc. fwd+grad": functools.partial(
            allpole_case, "associative", mode="grad"
        ),
    }
    if hasattr(retrax.ops, "lfilter"):
        makers["lfilter fwd"] = functools.partial(lfilter_case, mode="fwd")
        makers["lfilter fwd+grad"] = functools.partial(lfilter_case, mode="grad")
    else:
        notes.append(
            "`retrax.ops.lfilter` does not exist in this build: lfilter skipped."
        )
    makers["FM voice (6 op.) fwd"] = functools.partial(fm_case, mode="fwd")

    start = time.perf_counter()
    by_batch = {}
    length = round(BATCH_SECONDS * SAMPLE_RATE)
    for name, make in makers.items():
        rows = []
        for b in batches:
            ms = time_fn(make(b, length), args.budget)
            rows.append({"B": b, "ms": ms})
            print(f"{name:26s} B={b:5d}  {ms:10.3f} ms", file=sys.stderr, flush=True)
        by_batch[name] = rows
    by_length = {}
    for name in ("allpole fwd", "allpole fwd+grad", "allpole assoc. fwd"):
        rows = []
        for s in seconds:
            ms = time_fn(makers[name](1, round(s * SAMPLE_RATE)), args.budget)
            rows.append({"seconds": s, "ms": ms})
            print(f"{name:26s} {s:5g} s  {ms:10.3f} ms", file=sys.stderr, flush=True)
        by_length[name] = rows
    elapsed = time.perf_counter() - start

    knees = []
    for name, rows in by_batch.items():
        k = knee(rows)
        per_signal = rows[-1]["ms"] / rows[-1]["B"] / rows[0]["ms"]
        best = min(rows, key=lambda r: r["ms"] / r["B"])
        knees.append(
            f"- {name}: "
            + (
                f"flat up to B = {rows[[r['B'] for r in rows].index(k) - 1]['B']}, "
                f"more than {FLAT:g}x one signal's cost from B = {k}"
                if k
                else f"flat up to B = {rows[-1]['B']}"
            )
            + f"; cheapest per signal at B = {best['B']} "
            f"({best['ms'] / best['B'] / rows[0]['ms']:.2f}x one signal's cost "
            f"alone); at B = {rows[-1]['B']} one signal costs {per_signal:.2f}x "
            "what it costs alone."
        )
    ratios = [
        f"- {r_a['seconds']:g} s: associative / sequential = "
        f"{r_a['ms'] / r_s['ms']:.1f}x (forward, B = 1)"
        for r_s, r_a in zip(
            by_length["allpole fwd"], by_length["allpole assoc. fwd"], strict=True
        )
    ]
    ratios += [
        f"- B = {r_a['B']}, {BATCH_SECONDS:g} s: associative / sequential = "
        f"{r_a['ms'] / r_s['ms']:.1f}x (forward + grad)"
        for r_s, r_a in zip(
            by_batch["allpole fwd+grad"],
            by_batch["allpole assoc. fwd+grad"],
            strict=True,
        )
    ]
    plot(out / "bench_scaling.png", by_batch, by_length)
    text = "\n".join(
        [
            machine_line().replace("median ms per call", "fastest median ms per call"),
            "",
            f"Against batch size, {BATCH_SECONDS:g} s signals (in brackets: the "
            "cost relative to B = 1):",
            "",
            batch_table(by_batch),
            "",
            "Against signal length, one signal:",
            "",
            length_table(by_length),
            "",
            f"Where a batch stops being flat (a call costs more than {FLAT:g}x "
            "one signal):",
            "",
            *knees,
            "",
            "The associative method against the sequential one on this CPU:",
            "",
            *ratios,
            "",
            *[f"Note: {n}" for n in notes],
            "",
        ]
    )
    (out / "bench_scaling.md").write_text(text)
    print(text)
    print(f"wrote {out}/bench_scaling.{{png,md}} in {elapsed:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
