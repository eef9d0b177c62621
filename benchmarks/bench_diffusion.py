"""Diffusion benchmarks: training the circle MLP, and sampling a mixture.

Run from the project root: `python benchmarks/bench_diffusion.py`. Prints a
table of wall-clock times in seconds. Training time includes compilation
(the first `fit` call in a fresh process compiles its chunk) but not
interpreter start-up or imports. The JAX persistent compilation cache is not
enabled here, so every run compiles from scratch.
"""

import argparse
import pathlib
import sys
import time

import jax
import jax.numpy as jnp


def circle_data(key, num=4096, noise=0.02):
    k1, k2 = jax.random.split(key)
    theta = jax.random.uniform(k1, (num,), minval=0.0, maxval=2 * jnp.pi)
    pts = jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=1)
    return pts + noise * jax.random.normal(k2, pts.shape)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--x64", action="store_true", help="train in float64")
    parser.add_argument("--steps", type=int, default=6000)
    args = parser.parse_args()
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    # the checkout's sources, not another installed copy
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    import retrax.diffusion as rd

    rows = []
    key = jax.random.key(0)
    data = circle_data(jax.random.fold_in(key, 1))
    pred = rd.NoisePredictor(rd.TimeMLP(2, key=jax.random.fold_in(key, 2)), rd.VPSDE())
    jax.block_until_ready(data)

    start = time.perf_counter()
    trained, losses = rd.fit(
        pred, data, jax.random.fold_in(key, 3), steps=args.steps, progress=False
    )
    jax.block_until_ready((trained, losses))
    first = time.perf_counter() - start
    rows.append(
        (f"fit circle MLP, {args.steps} steps, batch 256 (incl. compile)", first)
    )

    start = time.perf_counter()
    trained, losses = rd.fit(
        pred, data, jax.random.fold_in(key, 4), steps=args.steps, progress=False
    )
    jax.block_until_ready((trained, losses))
    rows.append(
        (f"fit circle MLP, {args.steps} steps (compiled)", time.perf_counter() - start)
    )
    final = float(jnp.mean(losses[-500:]))

    dtype = "float64" if args.x64 else "float32"
    print(f"retrax.diffusion benchmarks ({dtype}, {jax.devices()[0].platform})")
    print(f"{'case':<62} {'seconds':>8}")
    for name, secs in rows:
        print(f"{name:<62} {secs:8.3f}")
    print(f"final loss (mean of last 500 steps): {final:.4f}")


if __name__ == "__main__":
    main()
