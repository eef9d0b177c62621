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

The Pose2 rows (`--pose2 100,1000`) solve the pose graph of
`examples/pose2_graph.py` (poses on two laps of a circle, noisy odometry,
20 loop closures, a prior on pose 0; GTSAM's between and prior errors as
`ResidualFactor`s) from dead reckoning with `solve_graph` (Levenberg-
Marquardt) and with GTSAM 4.3's `LevenbergMarquardtOptimizer` (default
parameters, and tight ones: relative and absolute error tolerances 1e-12)
and `GaussNewtonOptimizer`, in one process, interleaved by
`benchmarks/_harness.py`. Before any time counts, every answer is compared
with GTSAM's tight LM answer (angles wrapped); the table gives the largest
difference, the iterations (GTSAM's linearisations; retrax's trial steps and,
in brackets, those taken), the first call of `solve_graph` (trace, compile
and solve) and the warm medians. GTSAM computes in float64 only; the float32
rows compare retrax in float32 with it. Without gtsam (`pip install gtsam`)
its columns are skipped with a note.

Run: `python benchmarks/bench_factor_graph.py` (`--smoke` for a tiny run;
`--pose2 100,1000 --arm-poses "" --cpus 1` for the Pose2 rows alone, pinned
to one CPU).
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
sys.path.insert(0, str(pathlib.Path(__file__).parent))
import arm_pose_graph as arm  # noqa: E402
import numpy as np  # noqa: E402
import pose2_graph  # noqa: E402
from _harness import Case, optional_import, pin_cpus, run_table  # noqa: E402

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
    ok = bool(sol.result == rr.RESULTS.successful)
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
            bool(out.result == rr.RESULTS.successful),
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
            bool(out.result == rr.RESULTS.successful),
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


def _gtsam_problem(gtsam, problem, start):
    """GTSAM's graph and start values for `problem`."""
    noise = gtsam.noiseModel.Diagonal.Sigmas
    graph = gtsam.NonlinearFactorGraph()
    graph.add(
        gtsam.PriorFactorPose2(
            0,
            gtsam.Pose2(*problem.prior),
            noise(np.asarray(pose2_graph.PRIOR_SD)),
        )
    )
    odometry = noise(np.asarray(pose2_graph.ODOMETRY_SD))
    for i, m in enumerate(problem.odometry):
        graph.add(gtsam.BetweenFactorPose2(i, i + 1, gtsam.Pose2(*m), odometry))
    closure = noise(np.asarray(pose2_graph.CLOSURE_SD))
    for (i, j), m in zip(problem.closures, problem.closure_meas, strict=True):
        graph.add(gtsam.BetweenFactorPose2(int(i), int(j), gtsam.Pose2(*m), closure))
    values = gtsam.Values()
    for i, x in enumerate(start):
        values.insert(i, gtsam.Pose2(*x))
    return graph, values


def _gtsam_solvers(gtsam, graph, values):
    """GTSAM's LM (default and tight tolerances) and GN, each a callable
    returning `(poses, iterations)`."""

    def run(make):
        def solve():
            optimizer = make()
            result = optimizer.optimize()
            poses = gtsam.utilities.extractPose2(result)
            return poses, optimizer.iterations()

        return solve

    def lm(tight):
        params = gtsam.LevenbergMarquardtParams()
        if tight:
            params.setRelativeErrorTol(1e-12)
            params.setAbsoluteErrorTol(1e-12)
            params.setMaxIterations(100)
        return lambda: gtsam.LevenbergMarquardtOptimizer(graph, values, params)

    return {
        "gtsam LM": run(lm(False)),
        "gtsam LM tight": run(lm(True)),
        "gtsam GN": run(
            lambda: gtsam.GaussNewtonOptimizer(graph, values, gtsam.GaussNewtonParams())
        ),
    }


def _pose_diff(a, b):
    d = np.asarray(a, np.float64).reshape(-1, 3) - np.asarray(b, np.float64)
    d[:, 2] = np.arctan2(np.sin(d[:, 2]), np.cos(d[:, 2]))
    return float(np.abs(d).max())


def pose2_setup(poses, dtype, gtsam, notes):
    """One Pose2 case: its timed callables by library and its facts (steps,
    first call, answers' differences), after comparing the answers."""
    problem = pose2_graph.pose2_problem(poses)
    start = pose2_graph.dead_reckoning(problem)
    graph = pose2_graph.pose2_graph(problem, dtype)
    init = {"x": jnp.asarray(start, dtype)}
    solve = eqx.filter_jit(lambda g, i: rr.solve_graph(g, i, throw=False))
    t0 = time.perf_counter()
    sol = jax.block_until_ready(solve(graph, init))
    first = time.perf_counter() - t0
    facts = {
        "first call s": first,
        "steps": f"{int(sol.stats['num_steps'])} ({int(sol.stats['num_accepted'])})",
        "result": "successful"
        if bool(sol.result == rr.RESULTS.successful)
        else "FAILED",
    }
    fns = {"retrax": lambda: jax.block_until_ready(solve(graph, init).x)}
    if gtsam is not None:
        solvers = _gtsam_solvers(gtsam, *_gtsam_problem(gtsam, problem, start))
        reference, _ = solvers["gtsam LM tight"]()
        facts["max |dx| vs GTSAM tight"] = _pose_diff(sol.value["x"], reference)
        for name, fn in solvers.items():
            answer, iterations = fn()
            facts[f"{name} iterations"] = iterations
            facts[f"{name} max |dx|"] = _pose_diff(answer, reference)
            fns[name] = fn
        limit = 1e-6 if dtype == jnp.float64 else 1e-3 * np.abs(reference).max()
        if facts["max |dx| vs GTSAM tight"] > limit:
            notes.append(
                f"Pose2 {poses} {jnp.dtype(dtype).name}: retrax's answer differs "
                f"from GTSAM's by {facts['max |dx| vs GTSAM tight']:.1e} "
                f"(more than {limit:.0e})"
            )
    return fns, facts


def bench_pose2(sizes, dtypes, repeats, budget):
    """The Pose2 table against GTSAM (see the module docstring)."""
    notes = []
    gtsam = optional_import("gtsam", notes)
    cases, fns, facts = [], {}, {}
    for dtype in dtypes:
        for poses in sizes:
            name = f"Pose2 {poses} poses, {jnp.dtype(dtype).name}"
            fns[name], facts[name] = pose2_setup(poses, dtype, gtsam, notes)
            cases.append(Case(name, {}))
    libraries = ["retrax"] + ([] if gtsam is None else list(_gtsam_solvers_names()))
    rows = run_table(
        cases,
        {lib: (lambda case, lib=lib: fns[case.name].get(lib)) for lib in libraries},
        repeats=repeats,
        number=30,
        budget_s=budget,
    )
    head = ["case", "retrax ms"] + [f"{lib} ms (ratio)" for lib in libraries[1:]]
    head += ["steps (taken)", "first call s", "max |dx| vs GTSAM tight", "result"]
    head += [f"{lib} iterations" for lib in libraries[1:]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        f = facts[row["case"]]
        cells = [row["case"], f"{row['retrax']:.2f}"]
        cells += [
            f"{row[lib]:.2f} ({row[lib] / row['retrax']:.2f}x)" for lib in libraries[1:]
        ]
        dx = f.get("max |dx| vs GTSAM tight")
        cells += [
            f["steps"],
            f"{f['first call s']:.2f}",
            "" if dx is None else f"{dx:.1e}",
            f["result"],
        ]
        cells += [str(f[f"{lib} iterations"]) for lib in libraries[1:]]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "ratio: the peer's time over retrax's (above 1: retrax is faster); "
        "times are warm medians of one whole solve from dead reckoning."
    )
    lines.extend(notes)
    return "\n".join(lines)


def _gtsam_solvers_names():
    return ("gtsam LM", "gtsam LM tight", "gtsam GN")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3000, help="training steps")
    parser.add_argument("--poses", default="100,1000", help="arm poses")
    parser.add_argument(
        "--arm-poses",
        default=None,
        help='the arm rows\' poses ("" for none); --poses by default',
    )
    parser.add_argument("--pose2", default="100,1000", help="Pose2 graph sizes")
    parser.add_argument("--pose2-dtypes", default="float64,float32")
    parser.add_argument("--budget", type=float, default=1.0, help="s per median")
    parser.add_argument(
        "--cpus",
        default=None,
        help="comma-separated CPUs to pin the process to (e.g. 1): retrax and "
        "GTSAM then run on the same core",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loop-limit", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--markdown", default=None, help="write the table here")
    args = parser.parse_args(argv)
    affinity = pin_cpus(args.cpus)
    if args.smoke:
        args.steps, args.poses, args.repeats, args.pose2 = 200, "6,12", 1, "20"
    arm_poses = args.poses if args.arm_poses is None else args.arm_poses
    jax.config.update("jax_enable_x64", True)
    parts = []
    if arm_poses:
        parts.append(arm_table(args, [int(p) for p in arm_poses.split(",")]))
    if args.pose2:
        sizes = [int(p) for p in args.pose2.split(",")]
        dtypes = [jnp.dtype(d) for d in args.pose2_dtypes.split(",")]
        parts.append(bench_pose2(sizes, dtypes, args.repeats, args.budget))
    parts.append(f"CPU affinity: {affinity}.")
    text = "\n\n".join(parts)
    print(text)
    if args.markdown:
        pathlib.Path(args.markdown).write_text(text + "\n")
    return text


def arm_table(args, sizes):
    """The arm rows (see the module docstring)."""
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
    for poses in sizes:
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
    return "\n".join(lines)


if __name__ == "__main__":
    main()
