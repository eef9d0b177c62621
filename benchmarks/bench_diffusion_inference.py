"""Implicit-inference benchmarks: queries, batches, gradients, node evaluation.

Run from the project root: `python benchmarks/bench_diffusion_inference.py`
(`--steps` sets the circle MLP's training length; `--quick` trains briefly,
for a timing-only run). Every case is compiled and warmed up first; the table
reports the median wall-clock time of `--repeats` calls, in milliseconds.

Cases, with K = 128 field nodes (8 levels x 8 draws x 2):

- one query (x clamped, y free) on the closed-form ring (48-component mixture,
  float64) and on the trained circle MLP (float32);
- 1,024 vmapped queries of the circle MLP in float32;
- per query, one query alone against 1,024 vmapped queries (solved 16 at a
  time, the CPU default of `batch_chunk`, and in one loop over the whole
  batch), for the circle MLP and for a 4-D two-link-arm relation
  (`TimeMLP(4, hidden=128, depth=3)`, briefly trained; x = joint angles
  clamped, y = end effector free), float32 and float64;
- the gradient of a loss on the answers through inference (implicit function
  theorem), and its ratio to the inference alone;
- the field (and its Jacobian) with all nodes in one vmapped call, against a
  sequential `lax.fori_loop` over the nodes inside the same jit, at 256
  points in turn so that call overhead does not hide the difference.
"""

import argparse
import pathlib
import statistics
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def median_ms(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def prepared(fn, *args):
    compiled = eqx.filter_jit(fn)
    for _ in range(2):
        jax.block_until_ready(compiled(*args))
    return lambda: compiled(*args)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6000)
    parser.add_argument("--quick", action="store_true", help="train 500 steps")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    jax.config.update("jax_enable_x64", True)
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    import retrax.diffusion as rd
    import retrax.relations as rr

    sched = rd.VPSDE()
    key = jax.random.key(0)
    rows = []
    inf = jnp.inf

    # Closed-form ring, float64.
    ang = 2 * np.pi * np.arange(48) / 48
    ring = rd.GaussianMixtureEps(
        sched, jnp.asarray(np.stack([np.cos(ang), np.sin(ang)], 1)), 0.05
    )
    nodes64 = rr.field_nodes(jax.random.fold_in(key, 1), 2, samples=8)
    ring_model = rr.ImplicitDiffusion(ring, nodes64)
    rho64 = jnp.array([inf, 0.0])
    q64 = jnp.array([0.6, 0.5])
    fn = prepared(lambda m, q: rr.implicit_infer(m, q, rho64).value, ring_model, q64)
    rows.append(
        ("ring mixture (m=48), one query, float64", median_ms(fn, args.repeats))
    )

    # Circle MLP, float32.
    steps = 500 if args.quick else args.steps
    k_data, k_model, k_fit = jax.random.split(jax.random.fold_in(key, 2), 3)
    theta = jax.random.uniform(k_data, (4096,), jnp.float32, 0, 2 * jnp.pi)
    data = jnp.stack([jnp.cos(theta), jnp.sin(theta)], 1)
    data = data + 0.02 * jax.random.normal(jax.random.fold_in(k_data, 1), data.shape)
    data = data.astype(jnp.float32)
    pred = rd.NoisePredictor(rd.TimeMLP(2, key=k_model, dtype=jnp.float32), sched)
    pred, _ = rd.fit(pred, data, k_fit, steps=steps, progress=False)
    nodes32 = rr.field_nodes(
        jax.random.fold_in(key, 3), 2, samples=8, dtype=jnp.float32
    )
    mlp = rr.ImplicitDiffusion(pred, nodes32)
    rho = jnp.array([inf, 0.0], jnp.float32)

    def one(m, q):
        return rr.implicit_infer(m, q, rho).value

    q = jnp.array([0.6, 0.5], jnp.float32)
    t_one = median_ms(prepared(one, mlp, q), args.repeats)
    rows.append(("circle MLP, one query, float32", t_one))

    def loss_one(m, q):
        return 0.5 * (one(m, q)[1] - 0.7) ** 2

    grad_one = prepared(lambda m, q: eqx.filter_grad(loss_one)(m, q), mlp, q)
    t_grad_one = median_ms(grad_one, args.repeats)
    rows.append(("circle MLP, grad (weights) through one query", t_grad_one))

    n_batch = 1024
    kq = jax.random.fold_in(key, 4)
    xs = jax.random.uniform(kq, (n_batch,), jnp.float32, -0.9, 0.9)
    ys = jnp.where(
        jax.random.bernoulli(jax.random.fold_in(kq, 1), 0.5, (n_batch,)), 0.5, -0.5
    ).astype(jnp.float32)
    queries = jnp.stack([xs, ys], 1)

    def batch(m, qs):
        return jax.vmap(lambda a: rr.implicit_infer(m, a, rho, throw=False).value)(qs)

    t_batch = median_ms(prepared(batch, mlp, queries), max(3, args.repeats // 4))
    rows.append((f"circle MLP, {n_batch} vmapped queries, float32", t_batch))

    def loss_batch(m, qs):
        z = batch(m, qs)
        return 0.5 * jnp.mean((jnp.abs(z[:, 1]) - 0.7) ** 2)

    grad_batch = prepared(
        lambda m, qs: eqx.filter_grad(loss_batch)(m, qs), mlp, queries
    )
    t_grad_batch = median_ms(grad_batch, max(3, args.repeats // 4))
    rows.append((f"circle MLP, grad (weights) through {n_batch} queries", t_grad_batch))
    sols = eqx.filter_jit(
        lambda m, qs: jax.vmap(lambda a: rr.implicit_infer(m, a, rho, throw=False))(qs)
    )(mlp, queries)
    ok = int(jnp.sum(sols.converged & sols.stable))

    # Per query: one alone against 1,024 vmapped, chunked and in one loop.
    def arm_relation(dtype):
        k_arm = jax.random.fold_in(key, 6)
        k_data, k_model, k_fit = jax.random.split(k_arm, 3)
        ang = jax.random.uniform(k_data, (8192, 2), jnp.float32, -1.2, 1.2)
        ang = ang + jnp.array([0.0, 1.35], jnp.float32)
        tip = ang[:, 0:1] + jnp.stack([0 * ang[:, 1], ang[:, 1]], 1)
        xy = 0.6 * jnp.cos(tip[:, :1]) + 0.5 * jnp.cos(tip[:, 1:])
        xy = jnp.concatenate(
            [xy, 0.6 * jnp.sin(tip[:, :1]) + 0.5 * jnp.sin(tip[:, 1:])], 1
        )
        net = rd.TimeMLP(4, hidden=128, depth=3, key=k_model, dtype=jnp.float32)
        arm, _ = rd.fit(
            rd.NoisePredictor(net, sched),
            jnp.concatenate([ang, xy], 1),
            k_fit,
            steps=200 if args.quick else 1000,
            batch_size=512,
            progress=False,
        )
        arm = jax.tree.map(
            lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, arm
        )
        nodes = rr.field_nodes(jax.random.fold_in(k_arm, 1), 4, dtype=dtype)
        q = jax.random.uniform(jax.random.fold_in(k_arm, 2), (n_batch, 4), dtype)
        q = q * 2 - 1
        return rr.ImplicitDiffusion(arm, nodes), q, jnp.array([inf, inf, 0, 0], dtype)

    def circle_relation(dtype):
        cast = jax.tree.map(
            lambda a: a.astype(dtype) if eqx.is_inexact_array(a) else a, mlp
        )
        return cast, queries.astype(dtype), rho.astype(dtype)

    scaling = []
    for label, build in [("circle MLP", circle_relation), ("arm MLP", arm_relation)]:
        for dtype in (jnp.float32, jnp.float64):
            model, qs, r = build(dtype)

            def alone(m, a, r=r):
                return rr.implicit_infer(m, a, r, throw=False).value

            def vmapped(m, qs, chunk, r=r):
                return jax.vmap(
                    lambda a: (
                        rr.implicit_infer(m, a, r, throw=False, batch_chunk=chunk).value
                    )
                )(qs)

            t_alone = median_ms(prepared(alone, model, qs[0]), args.repeats)
            reps_b = max(3, args.repeats // 4)
            t_chunk = median_ms(
                prepared(lambda m, q: vmapped(m, q, 16), model, qs), reps_b
            )
            t_loop = median_ms(
                prepared(lambda m, q: vmapped(m, q, n_batch), model, qs), 3
            )
            name = f"{label}, {jnp.dtype(dtype).name}"
            scaling.append((name, t_alone, t_chunk / n_batch, t_loop / n_batch))

    # One vmapped call over the nodes against a sequential loop over them.

    def field_loop(m, z):
        nodes = m.nodes
        alpha = sched.alpha(nodes.t)
        sigma = sched.sigma(nodes.t)

        def body(k, acc):
            x = alpha[k] * z + sigma[k] * nodes.eps[k]
            eps = m.pred.epsilon(x, nodes.t[k])
            return acc + nodes.w[k] * m.lam * sigma[k] / alpha[k] * (eps - nodes.eps[k])

        return jax.lax.fori_loop(0, nodes.size, body, jnp.zeros_like(z))

    # 256 points one after another (lax.map) inside one jit, so that the call
    # overhead is amortised and the table compares the node evaluation itself.
    pts = jax.random.normal(jax.random.fold_in(key, 5), (256, 2), jnp.float32)

    def over_points(f):
        return lambda m, p: jax.lax.map(lambda y: f(m, y), p)

    def jac_vmap(m, y):
        return jax.jacfwd(m.prior_field)(y)

    def jac_loop(m, y):
        return jax.jacfwd(lambda u: field_loop(m, u))(y)

    reps = max(5, args.repeats // 2)
    t_vmap = median_ms(
        prepared(over_points(lambda m, y: m.prior_field(y)), mlp, pts), reps
    )
    t_loop = median_ms(prepared(over_points(field_loop), mlp, pts), reps)
    rows.append(("field at 256 points, K=128 nodes in one vmapped call", t_vmap))
    rows.append(("field at 256 points, fori_loop over the K=128 nodes", t_loop))
    t_jvmap = median_ms(prepared(over_points(jac_vmap), mlp, pts), reps)
    t_jloop = median_ms(prepared(over_points(jac_loop), mlp, pts), reps)
    rows.append(("field Jacobian at 256 points (jacfwd), vmapped nodes", t_jvmap))
    rows.append(("field Jacobian at 256 points (jacfwd), fori_loop", t_jloop))

    print(f"retrax implicit inference ({jax.devices()[0].platform}, K=128 nodes)")
    print(f"{'case':<58} {'ms':>10}")
    for name, ms in rows:
        print(f"{name:<58} {ms:10.3f}")
    print()
    print(f"per query (ms): one alone, {n_batch} vmapped in chunks of 16, in one loop")
    for name, a, c, loop in scaling:
        print(
            f"{name:<24} alone {a:7.3f}  chunked {c:7.3f} ({c / a:4.2f}x)"
            f"  one loop {loop:7.3f} ({loop / a:4.2f}x)"
        )
    print()
    print(f"gradient / inference, one query:      {t_grad_one / t_one:6.2f}")
    print(f"gradient / inference, {n_batch} queries: {t_grad_batch / t_batch:6.2f}")
    print(f"fori_loop / vmap, field:              {t_loop / t_vmap:6.2f}")
    print(f"fori_loop / vmap, field Jacobian:     {t_jloop / t_jvmap:6.2f}")
    print(f"{ok} of {n_batch} batch queries converged and stable")


if __name__ == "__main__":
    main()
