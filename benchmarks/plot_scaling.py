"""Time `allpole` against batch size and signal length, and plot it.

The case is the one of `bench_ops.py`: an order-2 time-varying all-pole filter
in float32, forward alone and forward plus the gradient with respect to every
input (x, a, zi), at 44.1 kHz.

- Against batch size, B = 1, 2, 4, ..., 1,024 signals (`jax.vmap`) of
  `--batch-seconds` (0.1 s): the cost per signal (a call's time divided by
  B) of retrax with its compiled kernel, of retrax's pure-JAX path (the
  `lax.scan`, `RETRAX_DISABLE_KERNELS=1`, in a worker process of its own that
  this script drives case by case, so the two paths' timings interleave), and
  of a plain C loop of the same recursion (`recursion_loops.c`, forward only,
  the hardware limit; see `bench_ops.py`).
- Against signal length, 0.1 s to 10 s at B = 1, with the kernel.

Writes `scaling.png` and `scaling.md` to `--out`.

Run: `python benchmarks/plot_scaling.py [--out docs/assets] [--quick]`, or
`--smoke` for a few tiny cases (the tests' run).
"""

import argparse
import importlib.metadata
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time


sys.path.insert(0, os.path.dirname(__file__))
from _harness import Case, repeated_medians_ms  # noqa: E402
from bench_ops import Checks, compile_loops, jax_case, loop_case  # noqa: E402

import retrax  # noqa: E402
from retrax.ops import allpole  # noqa: E402


SAMPLE_RATE = 44_100
BATCHES = tuple(2**k for k in range(11))  # 1 to 1,024
SECONDS = (0.1, 0.3, 1.0, 3.0, 10.0)
MODES = ("fwd", "grad")


def time_case(batch: int, length: int, mode: str, budget_s: float) -> float:
    """Median ms of one call, with as many calls as fit in about `budget_s`."""
    fn = jax_case(
        allpole, Case("", {"op": "allpole", "B": batch, "T": length, "mode": mode})
    )
    # The median of three medians damps a busy machine's spikes.
    return statistics.median(repeated_medians_ms(fn, budget_s))


def time_loop(lib, batch: int, length: int, budget_s: float) -> float:
    case = Case("", {"op": "allpole", "B": batch, "T": length, "mode": "fwd"})
    checks = Checks()
    fn = loop_case(lib, checks, case)
    if checks.verdicts.get(("", "c_loop")):
        raise AssertionError(f"the C loop differs from retrax: {checks.verdicts}")
    return statistics.median(repeated_medians_ms(fn, budget_s))


def worker() -> None:
    """Answer `B T mode budget` lines with a JSON line of the median ms."""
    kernel = retrax.kernels()["allpole"].active
    print(json.dumps({"kernel": kernel}), flush=True)
    for line in sys.stdin:
        batch, length, mode, budget = line.split()
        ms = time_case(int(batch), int(length), mode, float(budget))
        print(json.dumps({"ms": ms}), flush=True)


class PureJax:
    """A worker process running retrax with `RETRAX_DISABLE_KERNELS=1`."""

    def __init__(self):
        env = dict(os.environ, RETRAX_DISABLE_KERNELS="1")
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--worker"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        hello = json.loads(self.proc.stdout.readline())
        if hello["kernel"]:
            raise RuntimeError("the pure-JAX worker still uses the kernel")

    def time(self, batch: int, length: int, mode: str, budget_s: float) -> float:
        self.proc.stdin.write(f"{batch} {length} {mode} {budget_s}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the pure-JAX worker exited")
        return json.loads(line)["ms"]

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


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

    def version(name):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    versions = ", ".join(
        f"{name} {version(name)}" for name in ("retrax", "jax", "jaxlib", "equinox")
    )
    return (
        f"{os.cpu_count()} CPU cores ({cpu}), Python {platform.python_version()}, "
        f"{versions}; float32, median ms per call."
    )


SERIES = {
    "kernel fwd": "retrax (kernel) forward",
    "kernel grad": "retrax (kernel) forward + grad",
    "scan fwd": "pure JAX forward",
    "scan grad": "pure JAX forward + grad",
    "loop fwd": "C loop forward",
}


def batch_table(rows: list[dict], seconds: float) -> str:
    names = [k for k in SERIES if any(k in r for r in rows)]
    head = "| B | " + " | ".join(f"{SERIES[n]}, µs per signal" for n in names) + " |"
    lines = [head, "|---:|" + "---:|" * len(names)]
    for r in rows:
        cells = [str(r["B"])]
        for n in names:
            cells.append(f"{1e3 * r[n] / r['B']:.1f}" if n in r else "-")
        lines.append("| " + " | ".join(cells) + " |")
    eight = next((r for r in rows if r["B"] == 8), None)
    notes = []
    if eight is not None:
        top = rows[-1]
        for n in names:
            if n in eight and n in top and top["B"] > 8:
                ratio = (top[n] / top["B"]) / (eight[n] / 8)
                notes.append(
                    f"- {SERIES[n]}: per-signal cost at B = {top['B']} is "
                    f"{ratio:.2f}x that at B = 8."
                )
    return "\n".join(lines + ([""] + notes if notes else []))


def length_table(rows: list[dict]) -> str:
    head = "| length | samples | forward ms | forward + grad ms | grad / fwd |"
    lines = [head, "|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['seconds']:g} s | {r['T']:,} | {r['kernel fwd']:.3f} | "
            f"{r['kernel grad']:.3f} | {r['kernel grad'] / r['kernel fwd']:.1f} |"
        )
    return "\n".join(lines)


STYLE = {
    "kernel fwd": ("C0", "o-"),
    "kernel grad": ("C0", "s--"),
    "scan fwd": ("C1", "o-"),
    "scan grad": ("C1", "s--"),
    "loop fwd": ("C2", "^:"),
}


def plot(path: pathlib.Path, by_batch, by_length, batch_seconds: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8), layout="constrained")
    for name, label in SERIES.items():
        pts = [(r["B"], 1e3 * r[name] / r["B"]) for r in by_batch if name in r]
        if pts:
            color, fmt = STYLE[name]
            left.loglog(*zip(*pts, strict=True), fmt, color=color, label=label)
    batches = [r["B"] for r in by_batch]
    left.set_xticks(batches, [str(b) for b in batches])
    left.minorticks_off()
    left.set_xlabel(f"batch size B ({batch_seconds:g} s signals, jax.vmap)")
    left.set_ylabel("µs per signal")
    left.grid(True, which="major", alpha=0.3)
    left.legend(fontsize="small")
    xs = [r["seconds"] for r in by_length]
    right.loglog(xs, [r["kernel fwd"] for r in by_length], "o-", label="forward")
    right.loglog(
        xs, [r["kernel grad"] for r in by_length], "s--", label="forward + grad"
    )
    right.set_xlabel("signal length in s (B = 1, kernel)")
    right.set_ylabel("ms per call")
    right.grid(True, which="major", alpha=0.3)
    right.legend(fontsize="small")
    fig.suptitle("allpole, order 2, time-varying, float32, 44.1 kHz")
    fig.savefig(path, dpi=80)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/assets", help="output folder")
    parser.add_argument("--quick", action="store_true", help="a few cases only")
    parser.add_argument("--smoke", action="store_true", help="tiny cases (tests)")
    parser.add_argument("--budget", type=float, default=0.3, help="s per case")
    parser.add_argument("--batch-seconds", type=float, default=0.1)
    parser.add_argument("--no-scan", action="store_true", help="no pure-JAX path")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    batches, seconds = BATCHES, SECONDS
    batch_length = round(args.batch_seconds * SAMPLE_RATE)
    if args.quick:
        batches, seconds = BATCHES[::2], SECONDS[:3]
    if args.smoke:
        batches, seconds, batch_length = BATCHES[:2], (0.005,), 256
        args.budget = min(args.budget, 0.02)
    batch_seconds = batch_length / SAMPLE_RATE
    notes = []
    if not retrax.kernels()["allpole"].active:
        notes.append("the all-pole kernel is not active here: 'kernel' is the scan")
    loop = compile_loops(notes)
    scan = None if args.no_scan else PureJax()

    start = time.perf_counter()
    by_batch = []
    try:
        for b in batches:
            row = {"B": b}
            for mode in MODES:
                # the paths in turn for each case: a drifting load hits all
                row[f"kernel {mode}"] = time_case(b, batch_length, mode, args.budget)
                if scan is not None:
                    row[f"scan {mode}"] = scan.time(b, batch_length, mode, args.budget)
            if loop is not None:
                row["loop fwd"] = time_loop(loop, b, batch_length, args.budget)
            print(
                f"B={b:5d} "
                + "  ".join(f"{k} {v:9.3f} ms" for k, v in row.items() if k != "B"),
                file=sys.stderr,
                flush=True,
            )
            by_batch.append(row)
    finally:
        if scan is not None:
            scan.close()
    by_length = []
    for s in seconds:
        length = round(s * SAMPLE_RATE)
        row = {"seconds": s, "T": length}
        for mode in MODES:
            row[f"kernel {mode}"] = time_case(1, length, mode, args.budget)
        by_length.append(row)
        print(
            f"{s:5g} s  fwd {row['kernel fwd']:9.3f} ms  "
            f"grad {row['kernel grad']:9.3f} ms",
            file=sys.stderr,
            flush=True,
        )
    elapsed = time.perf_counter() - start

    plot(out / "scaling.png", by_batch, by_length, batch_seconds)
    text = "\n".join(
        [
            machine_line(),
            "",
            f"Cost per signal against batch size, {batch_seconds:g} s signals "
            f"({batch_length:,} samples):",
            "",
            batch_table(by_batch, batch_seconds),
            "",
            "Against signal length, one signal:",
            "",
            length_table(by_length),
            "",
            *[f"Note: {n}" for n in notes],
        ]
    )
    (out / "scaling.md").write_text(text.rstrip() + "\n")
    print(text)
    print(
        f"wrote {out / 'scaling.png'} and {out / 'scaling.md'} in {elapsed:.0f} s",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
