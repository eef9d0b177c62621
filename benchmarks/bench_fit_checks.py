"""What `fit`'s finiteness checks cost a healthy run.

`fit` checks every step's loss, and each chunk's parameters and optimiser
state (a chunk that fails runs again, checking every step's update, to name
the step). This times `fit` on the circle data with MLPs of several widths
against the same compiled chunk without the parameter and optimiser-state
checks, interleaved in one process, and prints medians and their ratio
(above 1: the checks cost that much).

    python3 benchmarks/bench_fit_checks.py --widths 64,128 --steps 3000

Pin it to one core for steady numbers (`taskset -c 1`, with
`XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"`).
"""

import argparse
import pathlib
import statistics
import sys
import time
import types

import equinox as eqx
import jax
import jax.numpy as jnp


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--widths", default="64,128", help="hidden widths")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    # the checkout's sources, not another installed copy
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    import retrax.diffusion as rd
    from retrax.diffusion import _train

    checked = _train._train_chunk
    raw = checked.__wrapped__
    # the same function with the state checks answering "finite" unseen
    namespace = dict(raw.__globals__, all_finite=lambda tree: jnp.asarray(True))
    unchecked = eqx.filter_jit(
        types.FunctionType(raw.__code__, namespace, raw.__name__, raw.__defaults__)
    )
    variants = {"checked": checked, "unchecked": unchecked}

    key = jax.random.key(0)
    data = jax.random.normal(key, (4096, 2))
    print(
        f"fit, {args.steps} Adam steps at batch 256, float32, medians of "
        f"{args.repeats} runs"
    )
    print("| hidden | checked (ms) | unchecked (ms) | checked / unchecked |")
    print("|---:|---:|---:|---:|")
    try:
        for width in (int(w) for w in args.widths.split(",")):
            model = rd.TimeMLP(2, hidden=width, key=jax.random.fold_in(key, 2))
            pred = rd.NoisePredictor(model, rd.VPSDE())

            def train(name, seed, pred=pred):
                _train._train_chunk = variants[name]
                run = rd.fit(
                    pred, data, jax.random.key(seed), steps=args.steps, progress=False
                )
                return jax.block_until_ready(run.losses)

            first = {name: train(name, 0) for name in variants}  # compile
            if not bool(jnp.all(first["checked"] == first["unchecked"])):
                raise SystemExit("the two variants' losses differ")
            times = {name: [] for name in variants}
            for seed in range(args.repeats):
                for name in variants:
                    start = time.perf_counter()
                    train(name, seed)
                    times[name].append(time.perf_counter() - start)
            med = {name: 1e3 * statistics.median(t) for name, t in times.items()}
            ratio = med["checked"] / med["unchecked"]
            print(
                f"| {width} | {med['checked']:.1f} | {med['unchecked']:.1f} "
                f"| {ratio:.3f} |"
            )
    finally:
        _train._train_chunk = checked


if __name__ == "__main__":
    main()
