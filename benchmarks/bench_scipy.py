"""Time retrax's scipy.signal names against scipy.signal, as a scipy user calls them.

Every name (`lfilter` with and without `zi`, `lfilter_zi`, `lfiltic`,
`filtfilt` with padding and with Gustafsson's method, `sosfilt`,
`sosfilt_zi`, `sosfiltfilt`, `freqz`, `sosfreqz`) is timed three ways in one
process, interleaved: retrax called eagerly (as a scipy user who swaps the
import calls it), retrax under `jax.jit`, and scipy.signal. Each output is
checked against scipy's before its time counts. Cases: Butterworth low-pass
designs of order 2, 4 and 8, float32 and float64, 1 s and 10 s at 44.1 kHz,
one signal and an `(8, T)` batch filtered along its last axis. The table
reports median ms and scipy's time over retrax's (above 1: retrax is faster).
Run from the repository root, e.g.

    python benchmarks/bench_scipy.py --quick
    python benchmarks/bench_scipy.py --samples 64 --batches 1
    python benchmarks/bench_scipy.py --markdown docs/assets/bench_scipy.md
"""

import argparse
import dataclasses
import pathlib
import sys


# time the checkout this script lives in, even from a venv with another retrax
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import jax  # noqa: E402


jax.config.update("jax_enable_x64", True)  # float64 cases; float32 stays float32

import numpy as np  # noqa: E402
import scipy.signal as ss  # noqa: E402
from _harness import Case, pin_cpus, run_table  # noqa: E402

import retrax.ops as rops  # noqa: E402


RATE = 44_100
NAMES = (
    "lfilter",
    "lfilter+zi",
    "lfilter_zi",
    "lfiltic",
    "filtfilt",
    "filtfilt gust",
    "sosfilt",
    "sosfilt+zi",
    "sosfilt_zi",
    "sosfiltfilt",
    "freqz",
    "sosfreqz",
)


@dataclasses.dataclass(frozen=True)
class Setup:
    name: str
    order: int
    dtype: str
    length: int  # samples
    batch: int


def _design(order: int, dtype):
    b, a = ss.butter(order, 0.2)
    sos = ss.butter(order, 0.2, output="sos")
    return b.astype(dtype), a.astype(dtype), sos.astype(dtype)


def _calls(setup: Setup):
    """`{name: (retrax_fn, scipy_fn, args)}`: the same call in both libraries."""
    dtype = np.dtype(setup.dtype)
    b, a, sos = _design(setup.order, dtype)
    length = setup.length
    shape = (length,) if setup.batch == 1 else (setup.batch, length)
    x = np.random.default_rng(0).standard_normal(shape).astype(dtype)
    zi = np.broadcast_to(ss.lfilter_zi(b, a), shape[:-1] + (len(a) - 1,))
    zi = np.ascontiguousarray(zi, dtype)
    sos_zi = ss.sosfilt_zi(sos).astype(dtype)
    if setup.batch > 1:
        sos_zi = np.ascontiguousarray(
            np.broadcast_to(sos_zi[:, None], (len(sos), setup.batch, 2))
        )
    y = x.reshape(-1)[: len(a) - 1]  # lfiltic takes one signal's history
    return {
        "lfilter": (rops.lfilter, ss.lfilter, (b, a, x)),
        "lfilter+zi": (
            lambda b, a, x, zi: rops.lfilter(b, a, x, zi=zi),
            lambda b, a, x, zi: ss.lfilter(b, a, x, zi=zi),
            (b, a, x, zi),
        ),
        "lfilter_zi": (rops.lfilter_zi, ss.lfilter_zi, (b, a)),
        "lfiltic": (rops.lfiltic, ss.lfiltic, (b, a, y)),
        "filtfilt": (rops.filtfilt, ss.filtfilt, (b, a, x)),
        "filtfilt gust": (
            lambda b, a, x: rops.filtfilt(b, a, x, method="gust"),
            lambda b, a, x: ss.filtfilt(b, a, x, method="gust"),
            (b, a, x),
        ),
        "sosfilt": (rops.sosfilt, ss.sosfilt, (sos, x)),
        "sosfilt+zi": (
            lambda sos, x, zi: rops.sosfilt(sos, x, zi=zi),
            lambda sos, x, zi: ss.sosfilt(sos, x, zi=zi),
            (sos, x, sos_zi),
        ),
        "sosfilt_zi": (rops.sosfilt_zi, ss.sosfilt_zi, (sos,)),
        "sosfiltfilt": (rops.sosfiltfilt, ss.sosfiltfilt, (sos, x)),
        "freqz": (
            lambda b, a: rops.freqz(b, a, worN=4096),
            lambda b, a: ss.freqz(b, a, worN=4096),
            (b, a),
        ),
        "sosfreqz": (
            lambda sos: rops.sosfreqz(sos, worN=4096),
            lambda sos: _scipy_freqz_sos(sos, worN=4096),
            (sos,),
        ),
    }


def _scipy_freqz_sos(sos, worN):
    # scipy renamed `sosfreqz` to `freqz_sos` (1.15); retrax has both names
    return getattr(ss, "freqz_sos", getattr(ss, "sosfreqz", None))(sos, worN=worN)


def _blocked(fn, args):
    return lambda: jax.block_until_ready(fn(*args))


def _matches(ours, theirs, dtype) -> float:
    ours = jax.tree.leaves(ours)
    theirs = [np.asarray(t) for t in jax.tree.leaves(theirs)]
    scale = max(float(np.max(np.abs(t))) for t in theirs) or 1.0
    worst = max(
        float(np.max(np.abs(np.asarray(o, np.complex128) - t)))
        for o, t in zip(ours, theirs, strict=True)
    )
    return worst / scale


def build(setups, names, check_tol):
    cases, fns, notes = [], {}, []
    for setup in setups:
        calls = _calls(setup)
        for name in names:
            ours, theirs, args = calls[name]
            label = f"{name} {setup.name}"
            ref = theirs(*args)
            jitted = jax.jit(ours)
            err = _matches(jitted(*args), ref, setup.dtype)
            tol = check_tol[setup.dtype]
            if not err <= tol:
                notes.append(
                    f"{label}: retrax differs from scipy by {err:.1e}; skipped"
                )
                continue
            cases.append(Case(label, {}))
            fns[label] = {
                "retrax eager": _blocked(ours, args),
                "retrax jit": _blocked(jitted, args),
                "scipy": lambda theirs=theirs, args=args: theirs(*args),
            }
    return cases, fns, notes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="order 4, 1 s, B = 1")
    parser.add_argument("--orders", default="2,4,8")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--seconds", default="1,10")
    parser.add_argument(
        "--samples", help="signal lengths in samples (e.g. 64), instead of --seconds"
    )
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--names", default=",".join(NAMES))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.2, help="s per median")
    parser.add_argument(
        "--cpus",
        default=None,
        help="comma-separated CPUs to pin the process to (e.g. 1): on a 2-core "
        "machine, XLA's programs and scipy then run on the same core",
    )
    parser.add_argument("--markdown", type=pathlib.Path, help="also write the table")
    args = parser.parse_args(argv)
    affinity = pin_cpus(args.cpus)
    if args.quick:
        args.orders, args.seconds, args.batches = "4", "1", "1"
    names = [n for n in args.names.split(",") if n]
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        parser.error(f"unknown names {unknown}; choose from {NAMES}")
    if args.samples:
        lengths = [(f"T={n}", int(n)) for n in args.samples.split(",")]
    else:
        lengths = [(f"{s}s", int(float(s) * RATE)) for s in args.seconds.split(",")]
    setups = [
        Setup(f"o{o} f{d[5:]} {label} B={bt}", int(o), d, length, int(bt))
        for d in args.dtypes.split(",")
        for label, length in lengths
        for bt in args.batches.split(",")
        for o in args.orders.split(",")
    ]
    check_tol = {"float32": 1e-3, "float64": 1e-9}
    cases, fns, notes = build(setups, names, check_tol)
    libraries = ["retrax eager", "retrax jit", "scipy"]
    rows = run_table(
        cases,
        {lib: (lambda case, lib=lib: fns[case.name][lib]) for lib in libraries},
        repeats=args.repeats,
        number=50,
        budget_s=args.budget,
    )
    head = ["case", "retrax eager ms", "retrax jit ms", "scipy ms"]
    head += ["scipy / eager", "scipy / jit"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        eager, jit, sp = row["retrax eager"], row["retrax jit"], row["scipy"]
        lines.append(
            f"| {row['case']} | {eager:.3f} | {jit:.3f} | {sp:.3f} | "
            f"{sp / eager:.2f}x | {sp / jit:.2f}x |"
        )
    slower = [r["case"] for r in rows if r["retrax jit"] > 1.1 * r["scipy"]]
    lines.append("")
    lines.append(
        f"jitted rows more than 10% slower than scipy ({len(slower)} of {len(rows)}): "
        + (", ".join(slower) if slower else "none")
    )
    eager_far = [r["case"] for r in rows if r["retrax eager"] > 1.5 * r["retrax jit"]]
    lines.append(
        f"eager rows more than 1.5x their jitted time ({len(eager_far)} of "
        f"{len(rows)}): " + (", ".join(eager_far) if eager_far else "none")
    )
    lines.append(f"CPU affinity: {affinity}.")
    lines.extend(notes)
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
