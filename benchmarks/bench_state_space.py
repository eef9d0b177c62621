"""Time `state_space`/`diag_state_space`, and the adjoint rule against BPTT.

1. Forward, float32, B = 1, T = 44,100 (1 s at 44.1 kHz), one input and one
   output: dense `state_space` and modal `diag_state_space` at N = 16, 64, 256.
2. The gradient at T = 441,000 (10 s) through retrax's custom rule (the
   adjoint filter run backwards) against plain back-propagation through a
   `lax.scan` of the same recursion (BPTT): median time, and peak memory as
   XLA's compiled `memory_analysis()` reports it (temporaries + arguments +
   outputs). Cases: a biquad `lfilter_tv`, `diag_state_space` N = 16 and dense
   `state_space` N = 16.

Run from the repository root: `python benchmarks/bench_state_space.py`.
Reports medians; the machine is noisy.
"""

import argparse
import pathlib
import statistics
import sys
import time


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402

import retrax.ops as rops  # noqa: E402


def timings_ms(fn, args, rounds):
    """Median and fastest of `rounds` calls, in ms."""
    fn = jax.jit(fn)
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times), 1e3 * min(times)


def interleaved_ms(fns, args, rounds):
    """Median ms of each function, called in turn within every round, so that
    the machine's load drifts hit them alike."""
    fns = [jax.jit(fn) for fn in fns]
    for fn in fns:
        jax.block_until_ready(fn(*args))
    times = [[] for _ in fns]
    for _ in range(rounds):
        for fn, spent in zip(fns, times, strict=True):
            start = time.perf_counter()
            jax.block_until_ready(fn(*args))
            spent.append(time.perf_counter() - start)
    return [1e3 * statistics.median(spent) for spent in times]


def peak_mib(fn, args):
    stats = jax.jit(fn).lower(*args).compile().memory_analysis()
    if stats is None:
        return float("nan")
    total = (
        stats.temp_size_in_bytes
        + stats.argument_size_in_bytes
        + stats.output_size_in_bytes
        - stats.alias_size_in_bytes
    )
    return total / 2**20


def system(rng, n_state, length, dtype=np.float32):
    A = rng.normal(size=(n_state, n_state))
    A = 0.99 * A / np.max(np.abs(np.linalg.eigvals(A)))
    B = rng.normal(size=(n_state, 1)) / np.sqrt(n_state)
    C = rng.normal(size=(1, n_state)) / np.sqrt(n_state)
    x = rng.normal(size=(length, 1))
    a = rng.uniform(-0.99, 0.99, n_state)
    return tuple(jnp.asarray(v, dtype) for v in (A, B, C, x, a))


def forward_table(rounds):
    rng = np.random.default_rng(0)
    length = 44_100
    print(f"forward, float32, B=1, T={length}, median (fastest) ms of {rounds}")
    print(f"{'N':>5}{'state_space':>20}{'diag_state_space':>20}")
    for n_state in (16, 64, 256):
        A, B, C, x, a = system(rng, n_state, length)
        dense = timings_ms(
            lambda A, B, C, x: rops.state_space(x, A=A, B=B, C=C, D=None),
            (A, B, C, x),
            max(5, rounds // (1 + n_state // 16)),
        )
        diag = timings_ms(
            lambda a, B, C, x: rops.diag_state_space(x, a=a, B=B, C=C, D=None),
            (a, B, C, x),
            rounds,
        )
        cells = [f"{m:.2f} ({low:.2f})" for m, low in (dense, diag)]
        print(f"{n_state:>5}{cells[0]:>20}{cells[1]:>20}")


def bptt_allpole(a, x):
    def step(carry, xt):
        y = xt - a[0] * carry[0] - a[1] * carry[1]
        return (y, carry[0]), y

    return lax.scan(step, (jnp.zeros((), x.dtype),) * 2, x)[1]


def bptt_biquad(b, a, x):
    w = bptt_allpole(a, x)
    return rops.fir(w, b=b)


def bptt_diag(a, B, C, x):
    def step(h, xt):
        return a * h + B @ xt, h

    return lax.scan(step, jnp.zeros(a.shape, x.dtype), x)[1] @ C.T


def bptt_dense(A, B, C, x):
    def step(h, xt):
        return A @ h + B @ xt, h

    return lax.scan(step, jnp.zeros(A.shape[0], x.dtype), x)[1] @ C.T


def gradient_table(rounds, dtype):
    rng = np.random.default_rng(1)
    length = 441_000
    A, B, C, x, a = system(rng, 16, length, dtype)
    xs = x[:, 0]
    bq_b = jnp.asarray([0.2, 0.4, 0.2], dtype)
    bq_a = jnp.asarray([-0.6, 0.3], dtype)
    cases = [
        (
            "biquad lfilter_tv",
            lambda b, a, x: rops.lfilter_tv(x, b=b, a=a),
            bptt_biquad,
            (bq_b, bq_a, xs),
        ),
        (
            "diag_state_space N=16",
            lambda a, B, C, x: rops.diag_state_space(x, a=a, B=B, C=C, D=None),
            bptt_diag,
            (a, B, C, x),
        ),
        (
            "state_space N=16",
            lambda A, B, C, x: rops.state_space(x, A=A, B=B, C=C, D=None),
            bptt_dense,
            (A, B, C, x),
        ),
    ]
    name = jnp.dtype(dtype).name
    print(
        f"\ngradient w.r.t. every input, {name}, B=1, T={length}, median ms of "
        f"{rounds} interleaved rounds"
    )
    print(
        f"{'case':<24}{'custom ms':>10}{'BPTT ms':>10}"
        f"{'custom MiB':>12}{'BPTT MiB':>10}"
    )
    for label, ours, naive, args in cases:
        argnums = tuple(range(len(args)))

        def grad_of(f, argnums=argnums):
            def loss(*v):
                return jnp.sum(f(*v) ** 2)

            return jax.grad(loss, argnums=argnums)

        # the same function: check before timing
        g1, g2 = jax.jit(grad_of(ours))(*args), jax.jit(grad_of(naive))(*args)
        for ours_g, naive_g in zip(g1, g2, strict=True):
            scale = float(jnp.max(jnp.abs(naive_g)))
            error = float(jnp.max(jnp.abs(ours_g - naive_g)))
            assert error <= 1e-2 * scale + 1e-6, label
        t1, t2 = interleaved_ms([grad_of(ours), grad_of(naive)], args, rounds)
        m1, m2 = peak_mib(grad_of(ours), args), peak_mib(grad_of(naive), args)
        print(f"{label:<24}{t1:>10.2f}{t2:>10.2f}{m1:>12.1f}{m2:>10.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    print(f"jax {jax.__version__}")
    forward_table(args.rounds)
    gradient_table(max(5, args.rounds // 5), np.float32)


if __name__ == "__main__":
    main()
