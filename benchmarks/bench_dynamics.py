"""Benchmark retrax's dynamics gradients against torchcomp and faustax.

Cases (float32, T = 44,100 samples, forward plus gradient with respect to
every input):

- `compexp_gain` and `limiter_gain`: the signal and every parameter, B = 1 and
  B = 8 signals with per-signal parameters. retrax and faustax run one signal
  (`jax.vmap` for B = 8); torchcomp takes the batch `(B, T)` and `(B,)`
  parameters itself.
- A whole compressor's gradient with respect to its parameters, B = 8 with
  per-item parameters: retrax's `Compressor` module (RMS detector, gain
  computer, ballistics; vmapped over a batch of modules) against faustax's
  Faust-generated `Compressor` (`process_normalized`, gradient with respect
  to its parameter matrix, back-propagated through its per-sample loop).
  The two compressors are not the same effect (faustax's has a soft knee and
  a peak detector); the case measures the cost of a gradient through a
  compressor in each library.

Peers are optional: a missing one is skipped with a note.

Run: `python benchmarks/bench_dynamics.py [--repeats 5] [--number 20]`
"""

import argparse
import os
import sys


# torchcomp's forward is a numba kernel and its backward runs torch: on two
# shared cores their thread pools collide with each other and with XLA's
# (compexp_gain B=1 grad measured 51 ms with two threads each, 6 ms with one).
# Give torchcomp its best setting: one thread each, set before numba loads.
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import jax
import jax.numpy as jnp
import numpy as np


sys.path.insert(0, os.path.dirname(__file__))
from _harness import Case, optional_import, print_table, run_table  # noqa: E402

from retrax.dynamics import compexp_gain, limiter_gain  # noqa: E402
from retrax.filters import Compressor  # noqa: E402


LENGTH = 44_100
SAMPLE_RATE = 44_100


def signals(batch: int):
    """Noise with a slow envelope, never silent (torchcomp and faustax give NaN
    gradients on a silent start), and its RMS-like level."""
    rng = np.random.default_rng(0)
    t = np.arange(LENGTH) / SAMPLE_RATE
    envelope = 0.05 + np.abs(np.sin(2 * np.pi * rng.uniform(1, 3, (batch, 1)) * t))
    x = (envelope * rng.standard_normal((batch, LENGTH))).astype(np.float32)
    x_rms = (envelope * rng.uniform(0.8, 1.2, (batch, LENGTH))).astype(np.float32)
    return x, x_rms


def compexp_params(batch: int):
    """comp_thresh, comp_ratio, exp_thresh, exp_ratio, at, rt; one per signal."""
    rng = np.random.default_rng(1)
    cols = [
        rng.uniform(-20, -10, batch),
        rng.uniform(2, 8, batch),
        rng.uniform(-50, -40, batch),
        rng.uniform(0.3, 0.7, batch),
        rng.uniform(0.01, 0.1, batch),
        rng.uniform(0.001, 0.01, batch),
    ]
    return [c.astype(np.float32) for c in cols]


def limiter_params(batch: int):
    """threshold, at, rt; one per signal."""
    rng = np.random.default_rng(2)
    cols = [
        rng.uniform(-12, -3, batch),
        rng.uniform(0.05, 0.5, batch),
        rng.uniform(0.001, 0.05, batch),
    ]
    return [c.astype(np.float32) for c in cols]


def inputs(case: Case):
    b = case.params["B"]
    x, x_rms = signals(b)
    if case.params["op"] == "compexp":
        return [x_rms, *compexp_params(b)]
    return [x, *limiter_params(b)]


def jax_gain_case(fn, case: Case):
    """Grad of sum(gain * w) w.r.t. every input of an unbatched JAX gain op."""
    args = [jnp.asarray(v) for v in inputs(case)]
    w = jnp.asarray(np.random.default_rng(3).standard_normal(args[0].shape), "f4")
    if case.params["B"] == 1:
        args = [a[0] for a in args]
        w = w[0]
        f = fn
    else:
        f = jax.vmap(fn)

    def loss(*args):
        return jnp.sum(f(*args) * w)

    grad = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
    return lambda: jax.block_until_ready(grad(*args))


def torch_gain_case(fn, torch, case: Case):
    args = [torch.from_numpy(v).requires_grad_(True) for v in inputs(case)]
    w = torch.from_numpy(
        np.random.default_rng(3).standard_normal(args[0].shape).astype("f4")
    )

    def run():
        for a in args:
            a.grad = None
        (fn(*args) * w).sum().backward()

    return run


def retrax_compressor_case(case: Case):
    x, _ = signals(case.params["B"])
    rng = np.random.default_rng(4)
    comps = [
        Compressor(
            threshold_db=float(rng.uniform(-30, -10)),
            ratio=float(rng.uniform(2, 8)),
            attack_ms=float(rng.uniform(1, 20)),
            release_ms=float(rng.uniform(50, 300)),
            makeup_db=float(rng.uniform(0, 6)),
            sample_rate=SAMPLE_RATE,
        )
        for _ in range(case.params["B"])
    ]
    comps = jax.tree.map(lambda *v: jnp.stack(v).astype(jnp.float32), *comps)
    x = jnp.asarray(x)

    def loss(comps):
        return jnp.sum(jax.vmap(lambda c, x: c(x))(comps, x) ** 2)

    grad = jax.jit(jax.grad(loss))
    return lambda: jax.block_until_ready(grad(comps))


def faustax_compressor_case(faustax, case: Case):
    x, _ = signals(case.params["B"])
    comp = faustax.Compressor(SAMPLE_RATE)
    rng = np.random.default_rng(4)
    matrix = jnp.asarray(rng.uniform(0.2, 0.8, (case.params["B"], comp.num_params)))
    matrix = matrix.astype(jnp.float32)
    x = jnp.asarray(x)[:, None, :]

    def loss(matrix):
        return jnp.sum(comp.process_normalized(x, matrix) ** 2)

    grad = jax.jit(jax.grad(loss))
    return lambda: jax.block_until_ready(grad(matrix))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--number", type=int, default=20)
    args = parser.parse_args()

    notes = []
    torch = optional_import("torch", notes)
    torchcomp = optional_import("torchcomp", notes) if torch else None
    faustax = optional_import("faustax", notes)
    faustax_dynamics = optional_import("faustax.dynamics", notes) if faustax else None
    if torch is not None:
        torch.set_num_threads(1)

    ops = {
        "compexp": ("compexp_gain", compexp_gain, "compexp_gain"),
        "limiter": ("limiter_gain", limiter_gain, "limiter_gain"),
    }

    def retrax_case(case):
        if case.params["op"] == "compressor":
            return retrax_compressor_case(case)
        return jax_gain_case(ops[case.params["op"]][1], case)

    libraries = {"retrax": retrax_case}
    if torchcomp is not None:
        libraries["torchcomp"] = lambda c: (
            None
            if c.params["op"] == "compressor"
            else torch_gain_case(getattr(torchcomp, ops[c.params["op"]][2]), torch, c)
        )
    if faustax_dynamics is not None:
        libraries["faustax"] = lambda c: (
            faustax_compressor_case(faustax, c)
            if c.params["op"] == "compressor"
            else jax_gain_case(getattr(faustax_dynamics, ops[c.params["op"]][2]), c)
        )

    cases = [
        Case(f"{ops[op][0]} grad B={b}", {"op": op, "B": b})
        for op in ("compexp", "limiter")
        for b in (1, 8)
    ]
    cases.append(Case("Compressor grad B=8", {"op": "compressor", "B": 8}))
    print(
        f"jax {jax.__version__}, {os.cpu_count()} CPU cores, float32, T={LENGTH}, "
        f"median ms over {args.repeats} interleaved repeats of {args.number} calls",
        file=sys.stderr,
    )
    rows = run_table(cases, libraries, repeats=args.repeats, number=args.number)
    print_table(rows, list(libraries))
    for note in notes:
        print(f"note: {note}")


if __name__ == "__main__":
    main()
