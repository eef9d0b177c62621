"""Interleaved timing of retrax against optional peer libraries.

Every case is timed for every library inside one repeat, and the repeats are
interleaved, so slow drifts of a shared machine hit all libraries alike. The
table reports the median over repeats of each library's median time, and each
peer's ratio to retrax (above 1: retrax is faster).
"""

import dataclasses
import importlib
import os
import statistics
import sys
import time
from collections.abc import Callable


@dataclasses.dataclass
class Case:
    name: str
    params: dict


def median_ms(fn: Callable[[], object], number: int) -> float:
    times = []
    for _ in range(number):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def repeated_medians_ms(
    fn: Callable[[], object], budget_s: float, repeats: int = 3
) -> list[float]:
    """`repeats` medians (ms) of one call of `fn`, after compiling and warming
    up, each over as many calls as fit in about `budget_s` (3 to 50)."""
    for _ in range(2):  # compile and warm up
        fn()
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    number = int(min(max(budget_s / max(once, 1e-6), 3), 50))
    return [median_ms(fn, number) for _ in range(repeats)]


def pin_cpus(spec: str | None) -> str:
    """Pin every thread of this process, and those it starts later, to the
    comma-separated CPUs of `spec` (`None`: leave the affinity alone), and
    describe the affinity for a table's header.

    On a small machine the operating system may run XLA's worker thread on
    one core and the Python thread (and the C loops it calls) on another, so
    that a kernel reads operands another core's cache holds: pinning one
    core compares every library in the same place."""
    if spec:
        cpus = {int(c) for c in spec.split(",")}
        for task in os.listdir("/proc/self/task"):
            os.sched_setaffinity(int(task), cpus)
        return f"pinned to CPU {spec}"
    return f"not pinned ({len(os.sched_getaffinity(0))} CPUs allowed)"


def optional_import(name: str, notes: list[str]):
    try:
        return importlib.import_module(name)
    except Exception as err:  # noqa: BLE001 - any failure means "not available"
        notes.append(f"{name} not available ({type(err).__name__}: {err}); skipped")
        return None


def run_table(
    cases: list[Case],
    libraries: dict[str, Callable[[Case], Callable[[], object] | None]],
    *,
    repeats: int,
    number: int,
    reference: str = "retrax",
    budget_s: float | None = None,
    warmup: int = 2,
) -> list[dict]:
    """Time `libraries[lib](case)` callables; `None` means "not supported".

    Each repeat takes the median of `number` calls of every callable, or,
    with `budget_s`, of as many as fit in about `budget_s` seconds (1 to
    `number`), so that a slow callable does not dominate the run. Each
    callable runs `warmup` times first (compilation), then once more to
    measure it."""
    prepared, numbers = {}, {}
    for case in cases:
        for lib, make in libraries.items():
            fn = make(case)
            if fn is not None:
                for _ in range(warmup):  # compile and warm up
                    fn()
                start = time.perf_counter()
                fn()
                once = time.perf_counter() - start
                print(
                    f"  prepared {case.name} / {lib}: one call {1e3 * once:.3f} ms",
                    file=sys.stderr,
                    flush=True,
                )
                prepared[case.name, lib] = fn
                numbers[case.name, lib] = (
                    number
                    if budget_s is None
                    else int(min(max(budget_s / max(once, 1e-6), 1), number))
                )
    samples = {key: [] for key in prepared}
    for rep in range(repeats):
        for key, fn in prepared.items():
            samples[key].append(median_ms(fn, numbers[key]))
        print(f"  repeat {rep + 1}/{repeats} done", file=sys.stderr, flush=True)
    rows = []
    for case in cases:
        row = {"case": case.name}
        for lib in libraries:
            if (case.name, lib) in samples:
                row[lib] = statistics.median(samples[case.name, lib])
        rows.append(row)
    return rows


def print_table(rows: list[dict], libraries: list[str], reference: str = "retrax"):
    peers = [lib for lib in libraries if lib != reference]
    head = ["case", f"{reference} ms"] + [f"{p} ms (ratio)" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["case"], f"{row[reference]:.3f}" if reference in row else "-"]
        for p in peers:
            if p in row and reference in row:
                cells.append(f"{row[p]:.3f} ({row[p] / row[reference]:.2f}x)")
            else:
                cells.append("-")
        lines.append("| " + " | ".join(cells) + " |")
    print("\n".join(lines))
