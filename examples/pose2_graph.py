"""A Pose2 pose graph as GTSAM users write it: poses on two laps of a circle,
noisy odometry between neighbours, loop closures between the laps and a
prior on the first pose, every factor a whitened residual
$\\mathrm{Logmap}(m^{-1} (x_i^{-1} x_j)) / \\sigma$ (GTSAM's
`BetweenFactorPose2` and `PriorFactorPose2` errors), solved from dead
reckoning by `solve_graph` (Levenberg-Marquardt on the stacked residuals).

`pose2_problem` builds the data (numpy, so that GTSAM can read the same
numbers), `pose2_graph` the retrax graph, `dead_reckoning` the start; the
benchmark `benchmarks/bench_factor_graph.py` compares them with GTSAM.

Run: `python examples/pose2_graph.py [--poses 1000]`.
"""

import argparse
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

import retrax.relations as rr


ODOMETRY_SD = (0.05, 0.05, 0.01)
CLOSURE_SD = (0.1, 0.1, 0.02)
PRIOR_SD = (1e-3, 1e-3, 1e-4)


class Pose2Problem(NamedTuple):
    """The data of a Pose2 graph: `(x, y, theta)` rows, float64 numpy."""

    truth: np.ndarray  # (poses, 3)
    odometry: np.ndarray  # (poses - 1, 3): pose i to pose i + 1
    closures: np.ndarray  # (closures, 2) integer pose pairs
    closure_meas: np.ndarray  # (closures, 3)
    prior: np.ndarray  # (3,)


def _compose(a, b):
    """`a * b` of Pose2s as `(..., 3)` rows (numpy or jax)."""
    xp = jnp if isinstance(a, jax.Array) or isinstance(b, jax.Array) else np
    c, s = xp.cos(a[..., 2]), xp.sin(a[..., 2])
    x = a[..., 0] + c * b[..., 0] - s * b[..., 1]
    y = a[..., 1] + s * b[..., 0] + c * b[..., 1]
    th = a[..., 2] + b[..., 2]
    return xp.stack([x, y, xp.arctan2(xp.sin(th), xp.cos(th))], axis=-1)


def between(a, b):
    """`a^{-1} * b` of Pose2s as `(..., 3)` rows (numpy or jax)."""
    xp = jnp if isinstance(a, jax.Array) or isinstance(b, jax.Array) else np
    c, s = xp.cos(a[..., 2]), xp.sin(a[..., 2])
    dx, dy = b[..., 0] - a[..., 0], b[..., 1] - a[..., 1]
    th = b[..., 2] - a[..., 2]
    return xp.stack(
        [c * dx + s * dy, -s * dx + c * dy, xp.arctan2(xp.sin(th), xp.cos(th))],
        axis=-1,
    )


def logmap(p):
    """GTSAM's `Pose2.Logmap` of one `(3,)` pose (jax): the twist whose
    exponential is `p`, with the angle in $(-\\pi, \\pi]$."""
    w = p[2]
    small = jnp.abs(w) < 1e-4
    half = jnp.where(small, 1.0, w / 2)
    # (w/2) cot(w/2), its series near 0 (a NaN-free derivative on both sides)
    a = jnp.where(small, 1 - w * w / 12, half * jnp.cos(half) / jnp.sin(half))
    b = w / 2
    return jnp.stack([a * p[0] + b * p[1], -b * p[0] + a * p[1], w])


def between_residual(sd, meas, xi, xj):
    """The whitened between error $\\mathrm{Logmap}(m^{-1} x_i^{-1} x_j) /
    \\sigma$ (`ResidualFactor`'s `residual(params, data, *values)`)."""
    return logmap(between(meas, between(xi, xj))) / sd


def prior_residual(params, _, x):
    """The whitened prior error $\\mathrm{Logmap}(m^{-1} x) / \\sigma$."""
    sd, mean = params
    return logmap(between(mean, x)) / sd


def pose2_problem(poses=1000, closures=20, seed=0, radius=10.0) -> Pose2Problem:
    """Poses on two laps of a circle (`poses` of them), odometry between
    neighbours with noise of sd `ODOMETRY_SD`, `closures` loop closures from
    evenly spaced poses of the first lap to the same place on the second
    (noise `CLOSURE_SD`), a prior on pose 0 at its true value."""
    rng = np.random.default_rng(seed)
    angle = 4 * np.pi * np.arange(poses) / poses
    truth = np.stack(
        [
            radius * np.sin(angle),
            radius * (1 - np.cos(angle)),
            np.arctan2(np.sin(angle), np.cos(angle)),
        ],
        axis=1,
    )
    odometry = between(truth[:-1], truth[1:])
    odometry = odometry + rng.normal(size=odometry.shape) * ODOMETRY_SD
    lap = poses // 2
    count = min(closures, lap)
    first = np.linspace(0, lap - 1, count).round().astype(np.int64) if count else []
    pairs = np.stack([first, np.asarray(first) + lap], axis=1).reshape(-1, 2)
    meas = between(truth[pairs[:, 0]], truth[pairs[:, 1]])
    meas = meas + rng.normal(size=meas.shape) * CLOSURE_SD
    return Pose2Problem(truth, odometry, pairs, meas, truth[0].copy())


def dead_reckoning(problem: Pose2Problem) -> np.ndarray:
    """The poses composed from the prior and the odometry alone, `(poses, 3)`."""
    out = [problem.prior]
    for step in problem.odometry:
        out.append(_compose(out[-1], step))
    return np.stack(out)


def pose2_graph(problem: Pose2Problem, dtype=None) -> rr.FactorGraph:
    """The retrax graph of `problem`: one `ResidualFactor` for the odometry,
    one for the closures, one for the prior (their sigmas as parameters), in
    `dtype` (JAX's default float by default)."""
    n = len(problem.truth)
    dtype = jnp.result_type(float) if dtype is None else dtype
    f = lambda a: jnp.asarray(a, dtype)  # noqa: E731
    factors = [
        rr.ResidualFactor(
            [("x", [0])],
            prior_residual,
            (f(PRIOR_SD), f(problem.prior)),
        ),
        rr.ResidualFactor(
            [("x", range(n - 1)), ("x", range(1, n))],
            between_residual,
            f(ODOMETRY_SD),
            f(problem.odometry),
        ),
    ]
    if len(problem.closures):
        factors.append(
            rr.ResidualFactor(
                [("x", problem.closures[:, 0]), ("x", problem.closures[:, 1])],
                between_residual,
                f(CLOSURE_SD),
                f(problem.closure_meas),
            )
        )
    return rr.FactorGraph({"x": (n, 3)}, factors)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--poses", type=int, default=1000)
    parser.add_argument("--closures", type=int, default=20)
    args = parser.parse_args(argv)
    jax.config.update("jax_enable_x64", True)
    problem = pose2_problem(args.poses, args.closures)
    graph = pose2_graph(problem)
    init = {"x": dead_reckoning(problem)}
    start = time.perf_counter()
    sol = rr.solve_graph(graph, init)
    jax.block_until_ready(sol.x)
    first = time.perf_counter() - start
    err = np.abs(np.asarray(sol.value["x"]) - problem.truth)
    print(
        f"{args.poses} poses, {len(problem.closures)} closures: "
        f"{int(sol.stats['num_steps'])} steps, result {sol.result}, first call "
        f"{first:.2f} s; max position error {err[:, :2].max():.3f}"
    )


if __name__ == "__main__":
    main()
