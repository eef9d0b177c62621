"""Diffusion benchmarks: training the circle MLP, and sampling a mixture.

Run from the project root: `python benchmarks/bench_diffusion.py` (add `--x64`
for float64). Prints a table of wall-clock seconds and the process's CPU
seconds (all threads). Training time includes compilation (the first `fit`
call in a fresh process compiles its chunk) but not interpreter start-up or
imports. The JAX persistent compilation cache is not enabled here, so every
run compiles from scratch.

Measured on the project's 2-core CPU machine, which other jobs shared (the
wall-clock time grows with the load; CPU time much less): the circle MLP
(5,122 parameters, 6,000 Adam steps at batch 256, float32) trained in 2.5 s
wall including compilation (0.9 s once compiled) at load average 3.5, and in
8.0 s wall / 3.3 s CPU at load average 8.5; float64 (`--x64`) took 3.8 s wall
at load 3.5.
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


def timed(fn):
    start, cpu = time.perf_counter(), time.process_time()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - start, time.process_time() - cpu


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--x64", action="store_true", help="run in float64")
    parser.add_argument("--steps", type=int, default=6000)
    args = parser.parse_args()
    if args.x64:
        jax.config.update("jax_enable_x64", True)
    # the checkout's sources, not another installed copy
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    import retrax.diffusion as rd

    rows = []
    key = jax.random.key(0)
    data = jax.block_until_ready(circle_data(jax.random.fold_in(key, 1)))
    model = rd.TimeMLP(2, key=jax.random.fold_in(key, 2))
    pred = rd.NoisePredictor(model, rd.VPSDE())

    def train(k):
        return rd.fit(pred, data, k, steps=args.steps, progress=False)

    _, wall, cpu = timed(lambda: train(jax.random.fold_in(key, 3)))
    rows.append(
        (f"fit circle MLP, {args.steps} steps, batch 256, incl. compile", wall, cpu)
    )
    run, wall, cpu = timed(lambda: train(jax.random.fold_in(key, 4)))
    losses = run.losses
    rows.append((f"fit circle MLP, {args.steps} steps, compiled", wall, cpu))
    final = float(jnp.mean(losses[-500:]))

    # samplers on a closed-form 3-component mixture, 5,000 samples each
    sched = rd.VPSDE()
    means = jnp.array([[-1.5, 0.0], [1.5, 0.5], [0.0, -1.5]])
    mix = rd.GaussianMixtureEps(
        sched, means, jnp.array([0.3, 0.25, 0.2]), jnp.array([0.5, 0.3, 0.2])
    )
    keys = jax.random.split(jax.random.fold_in(key, 5), 5000)
    samplers = [
        ("ancestral, 500 steps", lambda k: rd.sample_ancestral(mix, k, 2).value),
        ("DDIM, 100 steps", lambda k: rd.sample_ddim(mix, k, 2).value),
        ("probability-flow ODE, Tsit5", lambda k: rd.sample_ode(mix, k, 2).value),
    ]
    for name, sampler in samplers:
        fn = jax.jit(jax.vmap(sampler))
        _, wall, cpu = timed(lambda fn=fn: fn(keys))
        rows.append((f"5,000 samples, {name}, incl. compile", wall, cpu))
        xs, wall, cpu = timed(lambda fn=fn: fn(keys))
        rows.append((f"5,000 samples, {name}, compiled", wall, cpu))
    ll = jax.jit(jax.vmap(lambda x: rd.log_likelihood(mix, x).value))
    timed(lambda: ll(xs[:100]))
    _, wall, cpu = timed(lambda: ll(xs[:100]))
    rows.append(("log_likelihood of 100 points, compiled", wall, cpu))

    dtype = "float64" if args.x64 else "float32"
    print(f"retrax.diffusion benchmarks ({dtype}, {jax.devices()[0].platform})")
    print(f"{'case':<62} {'wall s':>8} {'cpu s':>8}")
    for name, wall, cpu in rows:
        print(f"{name:<62} {wall:8.3f} {cpu:8.3f}")
    print(f"final training loss (mean of the last 500 steps): {final:.4f}")


if __name__ == "__main__":
    main()
