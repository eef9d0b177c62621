"""A chain of arm poses as a factor graph: the engine against per-factor solves.

The graph of `examples/arm_pose_graph.py` (a learned two-link-arm relation per
pose, a measurement of each end effector, smoothness between neighbouring
poses) at several lengths, float64. Rows, each a median over repeats after
compiling:

- `joint solve`: `solve_graph`, the whole chain in one jitted call;
- `joint solve, float32 Jacobians`: the same with `jacobian_dtype=float32`
  (Newton's matrix from the float32-trained network in float32, the
  gradient and the answer in float64); its `max |dx|` column is its distance
  to the float64 solve;
- `belief propagation`: `propagate_beliefs` with the sequential schedule
  (a forward and a backward pass along the chain per iteration; flooding
  needs as many iterations as the chain is long), one jitted call;
- `vmapped factor queries`: every pose's relation queried on its own
  (`factor_infer` with the measured end effector as soft evidence), the
  poses in one `vmap`: what a user gets without the graph (no smoothness);
- `loop of factor queries`: the same queries, one jitted call per pose from
  a Python loop;
- `gradient`: `jax.grad` of a loss of the joint solve with respect to the
  relation's network (the implicit function theorem: one adjoint solve),
  and its ratio to the solve.

The joint angles' RMSE against the true track shows what the graph buys.

Run: `python benchmarks/bench_factor_graph.py` (`--smoke` for a tiny run).
"""

import argparse
import pathlib
import statistics
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp


sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "examples"))
import arm_pose_graph as arm  # noqa: E402

import retrax.relations as rr  # noqa: E402


def timed(fn, repeats):
    """Median seconds of `fn()` over `repeats` calls, after one to compile."""
    start = time.perf_counter()
    jax.block_until_ready(fn())
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - start)
    return statistics.median(times), first


def rmse(a, b):
    return float(jnp.sqrt(jnp.mean((a - b) ** 2)))


def bench(factor, poses, repeats, loop_limit):
    q_true, _, measured = arm.track(jax.random.key(2), poses)
    graph = arm.pose_graph(factor, measured)
    init = arm.start(measured)
    rows = []

    solve = eqx.filter_jit(lambda g, i: rr.solve_graph(g, i, throw=False))
    t, first = timed(lambda: solve(graph, init).x, repeats)
    sol = solve(graph, init)
    ok = rr.RESULTS[sol.result] == ""
    rows.append(
        (
            "joint solve",
            poses,
            t,
            first,
            int(sol.stats["num_steps"]),
            ok,
            rmse(sol.value["q"], q_true),
            None,
        )
    )

    mixed = eqx.filter_jit(
        lambda g, i: rr.solve_graph(g, i, jacobian_dtype=jnp.float32, throw=False)
    )
    t, first = timed(lambda: mixed(graph, init).x, repeats)
    out = mixed(graph, init)
    rows.append(
        (
            "joint solve, float32 Jacobians",
            poses,
            t,
            first,
            int(out.stats["num_steps"]),
            rr.RESULTS[out.result] == "",
            rmse(out.value["q"], q_true),
            float(jnp.max(jnp.abs(out.x - sol.x))),
        )
    )

    bp = eqx.filter_jit(
        lambda g, i: rr.propagate_beliefs(
            g, i, schedule="sequential", tol=1e-8, max_steps=100, throw=False
        )
    )
    t, first = timed(lambda: bp(graph, init).x, repeats)
    out = bp(graph, init)
    rows.append(
        (
            "belief propagation",
            poses,
            t,
            first,
            int(out.stats["num_steps"]),
            rr.RESULTS[out.result] == "",
            rmse(out.value["q"], q_true),
            None,
        )
    )

    def query(factor, xy):
        marks = {
            "q": rr.Latent(jnp.array([0.0, 1.35])),
            "xy": rr.Unobserved(xy, arm.SENSOR_SD**-2),
        }
        return rr.factor_infer(factor, marks, throw=False)

    batched = eqx.filter_jit(eqx.filter_vmap(query, in_axes=(None, 0)))
    t, first = timed(lambda: batched(factor, measured).value, repeats)
    sols = batched(factor, measured)
    ok = bool(jnp.all(sols.result == rr.RESULTS.successful))
    rows.append(
        (
            "vmapped factor queries",
            poses,
            t,
            first,
            int(jnp.max(sols.stats["num_steps"])),
            ok,
            rmse(sols.value[:, :2], q_true),
            None,
        )
    )

    if poses <= loop_limit:
        single = eqx.filter_jit(query)

        def loop():
            return [single(factor, xy).value for xy in measured]

        t, first = timed(loop, max(1, repeats // 3))
        rows.append(("loop of factor queries", poses, t, first, None, None, None, None))

    def loss(factor):
        g = arm.pose_graph(factor, measured)
        return jnp.sum(rr.solve_graph(g, init).value["q"] ** 2)

    grad = eqx.filter_jit(eqx.filter_grad(loss))
    t_grad, first = timed(lambda: jax.tree.leaves(grad(factor))[0], repeats)
    rows.append(
        ("gradient of the joint solve", poses, t_grad, first, None, None, None, None)
    )
    return rows, t_grad / rows[0][2]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000, help="training steps")
    parser.add_argument("--poses", default="100,1000")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loop-limit", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--markdown", default=None, help="write the table here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.steps, args.poses, args.repeats = 200, "6,12", 1
    jax.config.update("jax_enable_x64", True)
    start = time.perf_counter()
    pred = arm.train_arm(jax.random.key(0), args.steps)
    print(
        f"trained the arm relation ({args.steps} steps) in "
        f"{time.perf_counter() - start:.1f} s"
    )
    factor = arm.arm_factor(pred, jax.random.key(1))
    lines = [
        "| case | poses | median s | first call s | steps | all successful | q RMSE "
        "| max \\|dx\\| |",
        "|---|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for poses in (int(p) for p in args.poses.split(",")):
        rows, ratio = bench(factor, poses, args.repeats, args.loop_limit)
        ratios.append((poses, ratio))
        for name, n, t, first, steps, ok, err, dx in rows:
            cells = [
                name,
                str(n),
                f"{t:.4f}",
                f"{first:.2f}",
                "" if steps is None else str(steps),
                "" if ok is None else ("yes" if ok else "no"),
                "" if err is None else f"{err:.4f}",
                "" if dx is None else f"{dx:.1e}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for poses, ratio in ratios:
        lines.append(f"gradient / joint solve at {poses} poses: {ratio:.2f}x")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text + "\n")
    return text


if __name__ == "__main__":
    main()
