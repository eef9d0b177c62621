"""Time `allpole` against batch size and signal length, and plot it.

The case is the one of `bench_ops.py`: an order-2 time-varying all-pole filter
in float32, forward alone and forward plus the gradient with respect to every
input (x, a, zi). Batch sizes 1 to 64 at 1 s, and lengths 0.1 s to 10 s at
B = 1, all at 44.1 kHz. Writes a PNG and a markdown table.

Run: `python benchmarks/plot_scaling.py [--out docs/assets] [--quick]`
"""

import argparse
import importlib.metadata
import os
import pathlib
import platform
import statistics
import sys
import time


sys.path.insert(0, os.path.dirname(__file__))
from _harness import Case, repeated_medians_ms  # noqa: E402
from bench_ops import jax_case  # noqa: E402

from retrax.ops import allpole  # noqa: E402


SAMPLE_RATE = 44_100
BATCHES = (1, 2, 4, 8, 16, 32, 64)
SECONDS = (0.1, 0.3, 1.0, 3.0, 10.0)


def time_case(batch: int, length: int, mode: str, budget_s: float) -> float:
    """Median ms of one call, with as many calls as fit in about `budget_s`."""
    fn = jax_case(allpole, Case("", {"B": batch, "T": length, "mode": mode}))
    # The median of three medians damps a busy machine's spikes.
    return statistics.median(repeated_medians_ms(fn, budget_s))


def machine_line() -> str:
    cpu = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions = ", ".join(
        f"{name} {importlib.metadata.version(name)}"
        for name in ("retrax", "jax", "jaxlib", "equinox")
    )
    return (
        f"{os.cpu_count()} CPU cores ({cpu}), Python {platform.python_version()}, "
        f"{versions}; float32, median ms per call."
    )


def table(rows: list[dict]) -> str:
    head = "| B | length | samples | forward ms | forward + grad ms | grad / fwd |"
    lines = [head, "|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['B']} | {r['seconds']:g} s | {r['B'] * r['T']:,} | "
            f"{r['fwd']:.3f} | {r['grad']:.3f} | {r['grad'] / r['fwd']:.1f} |"
        )
    return "\n".join(lines)


def plot(path: pathlib.Path, by_batch: list[dict], by_length: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.4), layout="constrained")
    for ax, rows, key, label in (
        (left, by_batch, "B", "batch size B (1 s signals)"),
        (right, by_length, "seconds", "signal length in s (B = 1)"),
    ):
        xs = [r[key] for r in rows]
        ax.loglog(xs, [r["fwd"] for r in rows], "o-", label="forward")
        ax.loglog(xs, [r["grad"] for r in rows], "s-", label="forward + gradient")
        ax.set_xlabel(label)
        ax.set_ylabel("ms per call")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend()
    left.set_xticks(BATCHES, [str(b) for b in BATCHES])
    left.minorticks_off()
    fig.suptitle("allpole, order 2, time-varying, float32, 44.1 kHz")
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/assets", help="output folder")
    parser.add_argument("--quick", action="store_true", help="a few cases only")
    parser.add_argument("--budget", type=float, default=0.5, help="s per case")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    batches = BATCHES[:3] if args.quick else BATCHES
    seconds = SECONDS[:3] if args.quick else SECONDS
    results = {}

    def measure(batch, secs):
        if (batch, secs) not in results:
            length = round(secs * SAMPLE_RATE)
            row = {"B": batch, "seconds": secs, "T": length}
            for mode in ("fwd", "grad"):
                row[mode] = time_case(batch, length, mode, args.budget)
            print(
                f"B={batch:3d} {secs:5g} s  fwd {row['fwd']:9.3f} ms  "
                f"grad {row['grad']:9.3f} ms",
                file=sys.stderr,
                flush=True,
            )
            results[batch, secs] = row
        return results[batch, secs]

    start = time.perf_counter()
    by_batch = [measure(b, 1.0) for b in batches]
    by_length = [measure(1, s) for s in seconds]
    elapsed = time.perf_counter() - start

    plot(out / "scaling.png", by_batch, by_length)
    text = "\n".join(
        [
            machine_line(),
            "",
            "Against batch size, 1 s signals:",
            "",
            table(by_batch),
            "",
            "Against signal length, one signal:",
            "",
            table(by_length),
            "",
        ]
    )
    (out / "scaling.md").write_text(text)
    print(text)
    print(
        f"wrote {out / 'scaling.png'} and {out / 'scaling.md'} in {elapsed:.0f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
