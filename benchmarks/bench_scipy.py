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

Two more tables on request. `--layouts`: a long time-first stereo signal
`(T, 2)` (as soundfile returns a file) filtered along `axis=0`, against the
same samples stored `(2, T)` along `axis=-1` (600 s at 48 kHz by default,
`--layout-seconds`). `--stream`: 64 channels streamed in 1 s blocks through
`lfilter` and `sosfilt` with `zi`, as a user's loop
`y, zi = step(..., block, zi)` runs it: eager, jitted, jitted with `zi`
donated, and scipy's loop, in ms per block. Run from the repository root, e.g.

    python benchmarks/bench_scipy.py --quick
    python benchmarks/bench_scipy.py --samples 64 --batches 1
    python benchmarks/bench_scipy.py --markdown docs/assets/bench_scipy.md
    python benchmarks/bench_scipy.py --names "" --layouts --stream --cpus 0
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


LAYOUT_NAMES = ("sosfilt", "lfilter", "sosfiltfilt", "filtfilt")
LAYOUT_RATE = 48_000


def _layout_calls(name: str, dtype, length: int):
    """`(retrax_fn, scipy_fn, time_first, channels_first)` for a stereo
    signal of `length` samples: `fn(x, axis)`."""
    b, a, sos = _design(4, dtype)
    x = np.random.default_rng(1).standard_normal((length, 2)).astype(dtype)
    ours = {
        "sosfilt": lambda x, axis: rops.sosfilt(sos, x, axis=axis),
        "lfilter": lambda x, axis: rops.lfilter(b, a, x, axis=axis),
        "sosfiltfilt": lambda x, axis: rops.sosfiltfilt(sos, x, axis=axis),
        "filtfilt": lambda x, axis: rops.filtfilt(b, a, x, axis=axis),
    }[name]
    theirs = getattr(ss, name)
    coefficients = (sos,) if name.startswith("sos") else (b, a)
    return ours, (lambda x, axis: theirs(*coefficients, x, axis=axis)), x


def build_layouts(names, dtypes, seconds, check_tol):
    """Cases `<name> axis=0 (T,2)` and `<name> axis=-1 (2,T)` of one long
    stereo signal, each checked against scipy (the same layout) first."""
    cases, fns, notes = [], {}, []
    length = int(seconds * LAYOUT_RATE)
    for dtype in dtypes:
        for name in names:
            ours, theirs, x = _layout_calls(name, np.dtype(dtype), length)
            for axis, data in ((0, x), (-1, np.ascontiguousarray(x.T))):
                shape = "(T,2)" if axis == 0 else "(2,T)"
                label = f"{name} axis={axis} {shape} f{dtype[5:]} {seconds:g}s"
                jitted = jax.jit(lambda x, axis=axis, ours=ours: ours(x, axis))
                err = _matches(jitted(data), theirs(data, axis), dtype)
                if not err <= check_tol[dtype]:
                    notes.append(
                        f"{label}: retrax differs from scipy by {err:.1e}; skipped"
                    )
                    continue
                cases.append(Case(label, {}))
                fns[label] = {
                    "retrax eager": _blocked(
                        lambda x, a=axis, f=ours: f(x, a), (data,)
                    ),
                    "retrax jit": _blocked(jitted, (data,)),
                    "scipy": lambda data=data, axis=axis, f=theirs: f(data, axis),
                }
    return cases, fns, notes


def _layout_summary(rows) -> list[str]:
    """Each name's axis=0 time over its axis=-1 time (jitted and eager)."""
    by_case = {row["case"]: row for row in rows}
    lines = []
    for case, row in by_case.items():
        if " axis=0 " not in case:
            continue
        other = by_case.get(case.replace(" axis=0 (T,2) ", " axis=-1 (2,T) "))
        if other is None:
            continue
        jit = row["retrax jit"] / other["retrax jit"]
        eager = row["retrax eager"] / other["retrax eager"]
        name = case.replace(" axis=0 (T,2)", "")
        lines.append(
            f"- {name}: axis=0 / axis=-1 {jit:.2f}x jitted, {eager:.2f}x eager"
        )
    return lines


STREAM_NAMES = ("lfilter+zi", "sosfilt+zi")


def _stream_calls(name: str, dtype, channels: int, block: int, blocks: int):
    """`(step, scipy_step, coefficients, blocks, zi)` of a stream."""
    b, a, sos = _design(4, dtype)
    rng = np.random.default_rng(2)
    data = [rng.standard_normal((channels, block)).astype(dtype) for _ in range(blocks)]
    if name == "lfilter+zi":
        zi = np.zeros((channels, len(a) - 1), dtype)
        step = lambda b, a, x, zi: rops.lfilter(b, a, x, zi=zi)  # noqa: E731
        return step, lambda b, a, x, zi: ss.lfilter(b, a, x, zi=zi), (b, a), data, zi
    zi = np.zeros((len(sos), channels, 2), dtype)
    step = lambda sos, x, zi: rops.sosfilt(sos, x, zi=zi)  # noqa: E731
    return step, lambda sos, x, zi: ss.sosfilt(sos, x, zi=zi), (sos,), data, zi


def _streamed(step, coefficients, data, zi):
    """The user's loop: every block through `step`, the state carried."""
    ys = []
    for block in data:
        y, zi = step(*coefficients, block, zi)
        ys.append(y)
    return jax.block_until_ready((ys, zi))


STREAM_LIBRARIES = ("retrax eager", "retrax jit", "retrax jit donated", "scipy")


def build_streams(names, dtypes, channels, block, blocks, check_tol):
    """Cases of `blocks` blocks `(channels, block)` streamed with `zi`: each
    way's whole stream checked against scipy's first."""
    cases, fns, notes = [], {}, []
    for dtype in dtypes:
        for name in names:
            step, theirs, coefficients, data, zi = _stream_calls(
                name, np.dtype(dtype), channels, block, blocks
            )
            label = f"{name} f{dtype[5:]} {channels}x{block} x{blocks}"
            ways = {
                "retrax eager": step,
                "retrax jit": jax.jit(step),
                "retrax jit donated": jax.jit(
                    step, donate_argnums=len(coefficients) + 1
                ),
                "scipy": theirs,
            }
            ref = _streamed(theirs, coefficients, data, zi)
            errs = [
                _matches(
                    _streamed(way, coefficients, data, jax.numpy.asarray(zi)),
                    ref,
                    dtype,
                )
                for lib, way in ways.items()
                if lib != "scipy"
            ]
            if not max(errs) <= check_tol[dtype]:
                notes.append(
                    f"{label}: retrax differs from scipy by {max(errs):.1e}; skipped"
                )
                continue
            cases.append(Case(label, {}))
            fns[label] = {
                lib: (
                    lambda way=way, c=coefficients, d=data, z=zi, lib=lib: _streamed(
                        way, c, d, z if lib == "scipy" else jax.numpy.asarray(z)
                    )
                )
                for lib, way in ways.items()
            }
    return cases, fns, notes


def _stream_table(rows, blocks: int) -> list[str]:
    head = ["case"] + [f"{lib} ms/block" for lib in STREAM_LIBRARIES]
    head += ["scipy / jit", "scipy / donated"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        per = {lib: row[lib] / blocks for lib in STREAM_LIBRARIES}
        cells = [row["case"]] + [f"{per[lib]:.3f}" for lib in STREAM_LIBRARIES]
        cells.append(f"{per['scipy'] / per['retrax jit']:.2f}x")
        cells.append(f"{per['scipy'] / per['retrax jit donated']:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _table(rows) -> list[str]:
    head = ["case", "retrax eager ms", "retrax jit ms", "scipy ms"]
    head += ["scipy / eager", "scipy / jit"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        eager, jit, sp = row["retrax eager"], row["retrax jit"], row["scipy"]
        lines.append(
            f"| {row['case']} | {eager:.3f} | {jit:.3f} | {sp:.3f} | "
            f"{sp / eager:.2f}x | {sp / jit:.2f}x |"
        )
    return lines


def _extra_tables(args, libraries, check_tol) -> list[str]:
    """The `--layouts` and `--stream` tables, as lines of text."""
    lines = []
    dtypes = args.dtypes.split(",")
    timing = {"repeats": args.repeats, "number": 50, "budget_s": args.budget}
    if args.layouts:
        layout_names = [n for n in args.layout_names.split(",") if n]
        cases, fns, notes = build_layouts(
            layout_names, dtypes, args.layout_seconds, check_tol
        )
        rows = run_table(
            cases,
            {lib: (lambda case, lib=lib: fns[case.name][lib]) for lib in libraries},
            **timing,
        )
        lines += [
            "",
            "Time-first stereo along axis=0 against channels-first along axis=-1:",
        ]
        lines += ["", *_table(rows), ""]
        lines += _layout_summary(rows) + notes
    if args.stream:
        cases, fns, notes = build_streams(
            list(STREAM_NAMES),
            dtypes,
            args.stream_channels,
            args.stream_block,
            args.stream_blocks,
            check_tol,
        )
        rows = run_table(
            cases,
            {
                lib: (lambda case, lib=lib: fns[case.name][lib])
                for lib in STREAM_LIBRARIES
            },
            **timing,
        )
        lines += ["", "Streaming with zi, the state carried from block to block:"]
        lines += ["", *_stream_table(rows, args.stream_blocks)] + notes
    return lines


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
    parser.add_argument(
        "--layouts",
        action="store_true",
        help="also time a long time-first stereo signal along axis=0 against "
        "the same samples channels-first along axis=-1",
    )
    parser.add_argument("--layout-seconds", type=float, default=600.0)
    parser.add_argument("--layout-names", default=",".join(LAYOUT_NAMES))
    parser.add_argument(
        "--stream",
        action="store_true",
        help="also time streaming in blocks with zi (ms per block)",
    )
    parser.add_argument("--stream-channels", type=int, default=64)
    parser.add_argument("--stream-block", type=int, default=RATE, help="samples")
    parser.add_argument("--stream-blocks", type=int, default=10)
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
    lines = _table(rows)
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
    lines += _extra_tables(args, libraries, check_tol)
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
