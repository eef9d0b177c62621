"""Time retrax's ops called eagerly, as users call them, against the same call
jitted: `allpole` forward, and `jax.grad` of a loss of it, with the floor JAX
itself sets for an eager `grad` (a loss of a trivial jitted function).

    python benchmarks/bench_eager.py
    python benchmarks/bench_eager.py --lengths 64,44100 --repeats 5

Prints median ms of interleaved repeats and each eager call over its jitted
twin.
"""

import argparse
import pathlib
import sys


# time the checkout this script lives in, even from a venv with another retrax
HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from _harness import Case, run_table  # noqa: E402

from retrax.ops import allpole  # noqa: E402


def _calls(length: int) -> dict:
    x = jax.random.normal(jax.random.key(0), (length,), jnp.float32)
    a = jnp.array([-1.6, 0.8], jnp.float32)
    trivial = jax.jit(lambda x, a: x * a[0] + a[1])

    def loss(a):
        return jnp.mean(allpole(x, a) ** 2)

    def floor(a):
        return jnp.mean(trivial(x, a) ** 2)

    grad, floor_grad = jax.grad(loss), jax.grad(floor)
    jitted = {
        "allpole": jax.jit(allpole),
        "grad": jax.jit(grad),
        "JAX's grad floor": jax.jit(floor_grad),
    }
    eager = {"allpole": allpole, "grad": grad, "JAX's grad floor": floor_grad}
    args = {"allpole": (x, a), "grad": (a,), "JAX's grad floor": (a,)}

    def run(fn, args):
        return lambda: jax.block_until_ready(fn(*args))

    return {
        name: {
            "eager": run(eager[name], args[name]),
            "jit": run(jitted[name], args[name]),
        }
        for name in eager
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="64,44100")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--budget", type=float, default=0.2, help="s per median")
    args = parser.parse_args(argv)
    cases, fns = [], {}
    for length in (int(n) for n in args.lengths.split(",")):
        for name, pair in _calls(length).items():
            label = f"{name} T={length}"
            cases.append(Case(label, {}))
            fns[label] = pair
    rows = run_table(
        cases,
        {lib: (lambda case, lib=lib: fns[case.name][lib]) for lib in ("eager", "jit")},
        repeats=args.repeats,
        number=50,
        budget_s=args.budget,
    )
    print("float32; median ms; eager / jit is the eager call over its jitted twin")
    print("| case | eager ms | jit ms | eager / jit |")
    print("|---|---|---|---|")
    for row in rows:
        ratio = row["eager"] / row["jit"]
        print(
            f"| {row['case']} | {row['eager']:.3f} | {row['jit']:.3f} | {ratio:.2f}x |"
        )


if __name__ == "__main__":
    main()
