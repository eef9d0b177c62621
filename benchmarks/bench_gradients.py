"""What a gradient costs: jitted gradients of retrax's recursive filters against
their jitted forward pass, interleaved in one process.

The claim of the library is that a recursive filter's gradient is another
filter run backwards: a few forward passes of time. For each op, order and
dtype this times, as a user writes them,

- `forward`: `jax.jit(lambda x, c: op(x, c))`;
- `grad(all)`: `jax.jit(jax.grad(lambda x, c: jnp.sum(op(x, c) ** 2),
  argnums=(0, 1)))`, with respect to the signal and every coefficient;
- `grad(coeffs)`: the same with respect to the coefficients alone;

on one signal of `--length` samples (44,100 by default): `sosfilt` with 2, 4
and 8 sections (Butterworth band-passes), `lfilter` of orders 2, 4 and 8
(Butterworth low-passes), `allpole` of orders 2, 16, 24 and 32 with constant
and per-sample coefficients, in float32 and float64. With `--eeg` it adds
`sosfiltfilt` of a butter(8) band-pass (8 sections) on an EEG-sized batch
(64, 153600), float64.

The table gives each median in ms and the gradients' ratios to the forward
pass; the acceptance lines at the end list the rows whose gradient costs
more than `--target` forward passes. Pin with `--cpus` on a small machine.

Run: `python benchmarks/bench_gradients.py [--cpus 1] [--repeats 5]
[--eeg] [--markdown PATH]`.
"""

import argparse
import os
import sys


sys.path.insert(0, os.path.dirname(__file__))

import jax  # noqa: E402


jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import scipy.signal  # noqa: E402
from _harness import Case, pin_cpus, run_table  # noqa: E402

from retrax import ops  # noqa: E402


def _inputs(op: str, order: int, dtype, length: int, batch: int = 1):
    rng = np.random.default_rng(order)
    shape = (length,) if batch == 1 else (batch, length)
    x = jnp.asarray(rng.standard_normal(shape), dtype)
    if op in ("sosfilt", "sosfiltfilt"):
        band = [0.01, 0.3] if op == "sosfiltfilt" else [0.05, 0.4]
        sos = scipy.signal.butter(order, band, btype="band", output="sos")
        return x, jnp.asarray(sos, dtype)
    if op == "lfilter":
        b, a = scipy.signal.butter(order, 0.2)
        return x, (jnp.asarray(b, dtype), jnp.asarray(a, dtype))
    shape = (length, order) if op == "allpole tv" else (order,)
    return x, jnp.asarray(0.3 * rng.standard_normal(shape) / order, dtype)


def _op(op: str):
    return {
        "sosfilt": lambda x, c: ops.sosfilt(c, x),
        "sosfiltfilt": lambda x, c: ops.sosfiltfilt(c, x),
        "lfilter": lambda x, c: ops.lfilter(c[0], c[1], x),
        "allpole": lambda x, c: ops.allpole(x, c),
        "allpole tv": lambda x, c: ops.allpole(x, c),
    }[op]


def _cases(length: int, eeg: bool) -> list[Case]:
    cases = []
    for dtype in (jnp.float32, jnp.float64):
        for op, orders in [
            ("sosfilt", (2, 4, 8)),
            ("lfilter", (2, 4, 8)),
            ("allpole", (2, 16, 24, 32)),
            ("allpole tv", (2, 16, 24, 32)),
        ]:
            for order in orders:
                what = "sections" if op == "sosfilt" else "order"
                name = f"{op} {what} {order} {dtype.__name__}"
                # (a band-pass design of order N has N sections)
                params = dict(op=op, order=order, dtype=dtype, length=length)
                cases.append(Case(name, params))
    if eeg:
        params = dict(op="sosfiltfilt", order=8, dtype=jnp.float64, length=153600)
        cases.append(Case("sosfiltfilt (64, 153600) float64", {**params, "batch": 64}))
    return cases


def _maker(kind: str):
    def make(case: Case):
        p = case.params
        x, c = _inputs(p["op"], p["order"], p["dtype"], p["length"], p.get("batch", 1))
        op = _op(p["op"])

        def loss(x, c):
            return jnp.sum(op(x, c) ** 2)

        if kind == "forward":
            fn = jax.jit(op)
        elif kind == "grad(all)":
            fn = jax.jit(jax.grad(loss, argnums=(0, 1)))
        else:
            fn = jax.jit(jax.grad(loss, argnums=1))
        return lambda: jax.block_until_ready(fn(x, c))

    return make


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--number", type=int, default=30)
    parser.add_argument("--budget", type=float, default=0.5)
    parser.add_argument("--length", type=int, default=44100)
    parser.add_argument("--eeg", action="store_true")
    parser.add_argument("--target", type=float, default=3.0)
    parser.add_argument("--cpus", default=None, help="pin to these CPUs, e.g. 1")
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args(argv)
    affinity = pin_cpus(args.cpus)
    kinds = ["forward", "grad(all)", "grad(coeffs)"]
    rows = run_table(
        _cases(args.length, args.eeg),
        {kind: _maker(kind) for kind in kinds},
        repeats=args.repeats,
        number=args.number,
        reference="forward",
        budget_s=args.budget,
    )
    lines = [
        f"Jitted gradient against jitted forward, T = {args.length} unless "
        f"named, loss sum(y ** 2); CPU affinity: {affinity}; median of "
        f"{args.repeats} interleaved repeats.",
        "",
        "| case | forward ms | grad(all) ms (x forward) | grad(coeffs) ms "
        "(x forward) |",
        "|---|---|---|---|",
    ]
    over = []
    for row in rows:
        fwd = row["forward"]
        cells = [row["case"], f"{fwd:.3f}"]
        for kind in kinds[1:]:
            ratio = row[kind] / fwd
            cells.append(f"{row[kind]:.3f} ({ratio:.2f}x)")
            if ratio > args.target:
                over.append(f"{row['case']} {kind}: {ratio:.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Gradients above {args.target:g}x the forward pass: "]
    lines += [f"- {line}" for line in over] or ["- none"]
    report = "\n".join(lines)
    print(report)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(report + "\n")
    return over


if __name__ == "__main__":
    main()
