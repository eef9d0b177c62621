"""`graph_laplace` on Pose2 pose graphs: first call (trace, compile and run),
warm call, and GTSAM's `Marginals` on the same graph at the same point.

The graph: poses along a circle, noisy odometry between neighbours, a prior
on pose 0 and short loop closures (pose i to pose i + `--span`, so the graph
stays banded), every factor a whitened residual
$\\mathrm{Logmap}(m^{-1} (x_i^{-1} x_j)) / \\sigma$ in a `ResidualFactor`
(GTSAM's `BetweenFactorPose2` and `PriorFactorPose2` errors), float64. It is
solved by `solve_graph` from the true poses; `graph_laplace` is then timed on
that solution. GTSAM (an optional peer, skipped with a note when absent)
linearises the same factors at the same poses; its covariances live in each
pose's local frame, so they are rotated into the global coordinates retrax
uses ($M \\Sigma M^\\top$ with $M = \\mathrm{diag}(R(\\theta), 1)$) before the
comparison. The table's last column is the largest relative difference over
the poses (each pose's block against its own largest entry). GTSAM's
`Marginals` linearise with the Gauss-Newton precision $J_r^\\top J_r$,
`graph_laplace` with the residuals' full Hessian: the difference is of the
order of the residuals' curvature (about the noise's standard deviations).

Run: `python benchmarks/bench_graph_laplace.py [--poses 100 1000 10000]`.
"""

import argparse
import importlib.util
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np


# the Pose2 errors of examples/pose2_graph.py (GTSAM's), on another layout
sys.path.insert(0, str(pathlib.Path(__file__).parent.parent / "examples"))
from pose2_graph import (  # noqa: E402
    CLOSURE_SD,
    ODOMETRY_SD,
    PRIOR_SD,
    between,
    between_residual,
    prior_residual,
)


def pose2_problem(poses, span=3, every=25, seed=0, radius=50.0):
    """Truth, odometry, closure pairs and measurements (numpy, float64)."""
    rng = np.random.default_rng(seed)
    angle = 2 * np.pi * np.arange(poses) / poses
    truth = np.stack(
        [radius * np.sin(angle), radius * (1 - np.cos(angle)), angle], axis=1
    )
    truth[:, 2] = np.arctan2(np.sin(truth[:, 2]), np.cos(truth[:, 2]))
    odometry = between(truth[:-1], truth[1:])
    odometry = odometry + rng.normal(size=odometry.shape) * ODOMETRY_SD
    first = np.arange(0, poses - span, every)
    pairs = np.stack([first, first + span], axis=1)
    closure = between(truth[pairs[:, 0]], truth[pairs[:, 1]])
    closure = closure + rng.normal(size=closure.shape) * CLOSURE_SD
    return truth, odometry, pairs, closure


def retrax_graph(problem):
    import retrax.relations as rr

    truth, odometry, pairs, closure = problem
    n = len(truth)
    f = lambda a: jnp.asarray(a, jnp.float64)  # noqa: E731
    return rr.FactorGraph(
        {"x": (n, 3)},
        [
            rr.ResidualFactor([("x", [0])], prior_residual, (f(PRIOR_SD), f(truth[0]))),
            rr.ResidualFactor(
                [("x", np.arange(n - 1)), ("x", np.arange(1, n))],
                between_residual,
                f(ODOMETRY_SD),
                f(odometry),
            ),
            rr.ResidualFactor(
                [("x", pairs[:, 0]), ("x", pairs[:, 1])],
                between_residual,
                f(CLOSURE_SD),
                f(closure),
            ),
        ],
    )


def gtsam_marginals(problem, poses_at):
    """GTSAM's marginal covariances of every pose at `poses_at`, rotated into
    global coordinates, and the time of `Marginals` plus every
    `marginalCovariance` (s)."""
    import gtsam

    truth, odometry, pairs, closure = problem
    graph = gtsam.NonlinearFactorGraph()
    noise = gtsam.noiseModel.Diagonal.Sigmas
    graph.add(gtsam.PriorFactorPose2(0, gtsam.Pose2(*truth[0]), noise(PRIOR_SD)))
    for i, m in enumerate(odometry):
        graph.add(
            gtsam.BetweenFactorPose2(i, i + 1, gtsam.Pose2(*m), noise(ODOMETRY_SD))
        )
    for (i, j), m in zip(pairs, closure, strict=True):
        graph.add(
            gtsam.BetweenFactorPose2(int(i), int(j), gtsam.Pose2(*m), noise(CLOSURE_SD))
        )
    values = gtsam.Values()
    for i, p in enumerate(poses_at):
        values.insert(i, gtsam.Pose2(*p))
    start = time.perf_counter()
    marginals = gtsam.Marginals(graph, values)
    covs = [marginals.marginalCovariance(i) for i in range(len(poses_at))]
    elapsed = time.perf_counter() - start
    out = []
    for p, cov in zip(poses_at, covs, strict=True):
        m = np.eye(3)
        c, s = np.cos(p[2]), np.sin(p[2])
        m[:2, :2] = [[c, -s], [s, c]]
        out.append(m @ cov @ m.T)
    return np.stack(out), elapsed


def max_relative_difference(a, b):
    scale = np.abs(b).max(axis=(1, 2))
    return float((np.abs(a - b).max(axis=(1, 2)) / scale).max())


def run(poses, span, every):
    import retrax.relations as rr

    problem = pose2_problem(poses, span, every)
    start = time.perf_counter()
    graph = retrax_graph(problem)
    built = time.perf_counter() - start
    sol = rr.solve_graph(graph, {"x": problem[0]})
    jax.block_until_ready(sol.x)
    start = time.perf_counter()
    covs = jax.block_until_ready(rr.graph_laplace(graph, sol))["x"]
    first = time.perf_counter() - start
    warm = []
    for _ in range(3):
        start = time.perf_counter()
        jax.block_until_ready(rr.graph_laplace(graph, sol))
        warm.append(time.perf_counter() - start)
    row = {
        "poses": poses,
        "band": graph.banded.size,
        "build_s": built,
        "result": (
            "successful" if sol.result == rr.RESULTS.successful else str(sol.result)
        ),
        "first_s": first,
        "warm_ms": 1e3 * min(warm),
    }
    if importlib.util.find_spec("gtsam") is not None:
        ref, gtsam_s = gtsam_marginals(problem, np.asarray(sol.value["x"]))
        row["gtsam_ms"] = 1e3 * gtsam_s
        row["rel_diff"] = max_relative_difference(np.asarray(covs), ref)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--poses", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--span", type=int, default=3, help="closure length")
    parser.add_argument("--every", type=int, default=25, help="poses per closure")
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    if importlib.util.find_spec("gtsam") is None:
        print("gtsam is not installed: its columns are skipped (pip install gtsam).")
    header = (
        f"{'poses':>7} {'band':>5} {'build s':>8} {'first s':>8} {'warm ms':>8} "
        f"{'GTSAM ms':>9} {'max rel diff':>13}  solve"
    )
    print(header)
    for poses in args.poses:
        r = run(poses, args.span, args.every)
        gt = f"{r['gtsam_ms']:9.1f}" if "gtsam_ms" in r else f"{'-':>9}"
        rd = f"{r['rel_diff']:13.2e}" if "rel_diff" in r else f"{'-':>13}"
        print(
            f"{r['poses']:7d} {r['band']:5d} {r['build_s']:8.2f} {r['first_s']:8.2f} "
            f"{r['warm_ms']:8.2f} {gt} {rd}  {r['result']}",
            flush=True,
        )


if __name__ == "__main__":
    main()
