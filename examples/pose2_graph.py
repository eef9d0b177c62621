"""A Pose2 pose graph as GTSAM users write it: poses on two laps of a circle,
noisy odometry between neighbours, loop closures between the laps and a
prior on the first pose, every factor a whitened residual
$\\mathrm{Logmap}(m^{-1} (x_i^{-1} x_j)) / \\sigma$ (GTSAM's
`BetweenFactorPose2` and `PriorFactorPose2` errors), solved from dead
reckoning by `solve_graph` (Levenberg-Marquardt on the stacked residuals),
with each pose's Laplace marginal from `graph_laplace`; where gtsam is
installed (`pip install gtsam`), its Levenberg-Marquardt answer and
`Marginals` on the same graph are compared.

`pose2_problem` builds the data (numpy, so that GTSAM can read the same
numbers), `pose2_graph` the retrax graph, `dead_reckoning` the start; the
benchmark `benchmarks/bench_factor_graph.py` times them against GTSAM, and
`examples/pose2_learned_odometry.py` replaces the odometry factor by a
learned one.

Run: `python examples/pose2_graph.py` (`--smoke` for a cheap run, `--poses`
and `--closures` for other sizes; `--plot` and `--json` write the figure
and the numbers).
"""

import argparse
import json
import pathlib
import time
from typing import NamedTuple

import equinox as eqx
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


def compose(a, b):
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


# --8<-- [start:residuals]
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


# --8<-- [end:residuals]


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
    first = np.linspace(0, lap - 1, count).round().astype(np.int64)
    pairs = np.stack([first, first + lap], axis=1).reshape(-1, 2)
    meas = between(truth[pairs[:, 0]], truth[pairs[:, 1]])
    meas = meas + rng.normal(size=meas.shape) * CLOSURE_SD
    return Pose2Problem(truth, odometry, pairs, meas, truth[0].copy())


def dead_reckoning(problem: Pose2Problem) -> np.ndarray:
    """The poses composed from the prior and the odometry alone, `(poses, 3)`."""
    out = [problem.prior]
    for step in problem.odometry:
        out.append(compose(out[-1], step))
    return np.stack(out)


# --8<-- [start:graph]
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


# --8<-- [end:graph]


def gtsam_answers(problem: Pose2Problem, start: np.ndarray, at: np.ndarray):
    """GTSAM 4.3's answers on the same graph, or `None` without gtsam: its
    Levenberg-Marquardt solve from `start` (default parameters, and tight
    ones: error tolerances 1e-12) with its iterations, and its `Marginals` at
    `at` rotated into global `(x, y, theta)` coordinates (GTSAM's are in
    each pose's own frame)."""
    try:
        import gtsam
    except ImportError:
        return None
    noise = gtsam.noiseModel.Diagonal.Sigmas
    graph = gtsam.NonlinearFactorGraph()
    graph.add(gtsam.PriorFactorPose2(0, gtsam.Pose2(*problem.prior), noise(PRIOR_SD)))
    for i, m in enumerate(problem.odometry):
        graph.add(
            gtsam.BetweenFactorPose2(i, i + 1, gtsam.Pose2(*m), noise(ODOMETRY_SD))
        )
    for (i, j), m in zip(problem.closures, problem.closure_meas, strict=True):
        graph.add(
            gtsam.BetweenFactorPose2(int(i), int(j), gtsam.Pose2(*m), noise(CLOSURE_SD))
        )

    def values(poses):
        out = gtsam.Values()
        for i, x in enumerate(poses):
            out.insert(i, gtsam.Pose2(*x))
        return out

    answers = {}
    for name, tight in (("lm", False), ("lm_tight", True)):
        params = gtsam.LevenbergMarquardtParams()
        if tight:
            params.setRelativeErrorTol(1e-12)
            params.setAbsoluteErrorTol(1e-12)
            params.setMaxIterations(100)
        optimizer = gtsam.LevenbergMarquardtOptimizer(graph, values(start), params)
        poses = gtsam.utilities.extractPose2(optimizer.optimize())
        answers[name] = (np.asarray(poses), optimizer.iterations())
    marginals = gtsam.Marginals(graph, values(at))
    covs = []
    for i, p in enumerate(at):
        c, s = np.cos(p[2]), np.sin(p[2])
        rot = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
        covs.append(rot @ marginals.marginalCovariance(i) @ rot.T)
    answers["marginals"] = np.stack(covs)
    return answers


def pose_difference(a, b) -> float:
    """The largest coordinate difference of two `(poses, 3)` arrays, angles
    wrapped."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    d[:, 2] = np.arctan2(np.sin(d[:, 2]), np.cos(d[:, 2]))
    return float(np.abs(d).max())


def errors(poses, truth) -> dict[str, float]:
    """Position RMSE and largest position error against `truth`, and the
    heading RMSE (wrapped)."""
    poses, truth = np.asarray(poses), np.asarray(truth)
    dist = np.hypot(*(poses[:, :2] - truth[:, :2]).T)
    dth = np.arctan2(
        np.sin(poses[:, 2] - truth[:, 2]), np.cos(poses[:, 2] - truth[:, 2])
    )
    return {
        "position_rmse": float(np.sqrt(np.mean(dist**2))),
        "position_max": float(dist.max()),
        "heading_rmse": float(np.sqrt(np.mean(dth**2))),
    }


def rounded(tree, digits=4):
    """`tree` (dicts and lists of numbers) with every float rounded to
    `digits` significant digits, for printing."""
    if isinstance(tree, dict):
        return {k: rounded(v, digits) for k, v in tree.items()}
    if isinstance(tree, list):
        return [rounded(v, digits) for v in tree]
    if isinstance(tree, float):
        return float(f"{tree:.{digits}g}")
    return tree


def plot(problem, start, poses, covs, path, title):
    """Left: truth, dead reckoning and the answer. Right: each pose's position
    error against the truth and three standard deviations of its Laplace
    marginal along its widest axis, with the closures' poses marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.6))
    ax.plot(*start[:, :2].T, "--", color="tab:gray", lw=1, label="dead reckoning")
    ax.plot(*problem.truth[:, :2].T, "k-", lw=1, label="truth")
    ax.plot(*poses[:, :2].T, "-", color="tab:red", lw=1, label="solve_graph")
    ax.set_aspect("equal")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(title, fontsize=10)
    index = np.arange(len(poses))
    for name, xs, style in (
        ("dead reckoning", start, "--"),
        ("solve_graph", poses, "-"),
    ):
        err = np.hypot(*(xs[:, :2] - problem.truth[:, :2]).T)
        color = "tab:gray" if style == "--" else "tab:red"
        bx.plot(index, err, style, color=color, lw=1, label=f"{name}: position error")
    widest = np.sqrt(np.linalg.eigvalsh(covs[:, :2, :2])[:, -1])
    bx.plot(
        index, 3 * widest, "-", color="tab:blue", lw=1, label="3 sd (Laplace marginal)"
    )
    for i in np.unique(problem.closures):
        bx.axvline(i, color="tab:orange", lw=0.5, alpha=0.6)
    bx.plot([], [], color="tab:orange", lw=0.5, label="a loop closure's pose")
    bx.set_yscale("log")
    bx.set_ylim(bottom=1e-3)  # pose 0 sits on its prior
    bx.set_xlabel("pose")
    bx.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(smoke=False, poses=None, closures=None, plot_path=None, json_path=None):
    jax.config.update("jax_enable_x64", True)
    poses = (40 if smoke else 1000) if poses is None else poses
    closures = (4 if smoke else 20) if closures is None else closures
    problem = pose2_problem(poses, closures)
    graph = pose2_graph(problem)
    start = dead_reckoning(problem)
    init = {"x": jnp.asarray(start)}

    # --8<-- [start:solve]
    solve = eqx.filter_jit(lambda g, i: rr.solve_graph(g, i))
    t0 = time.perf_counter()
    sol = jax.block_until_ready(solve(graph, init))
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    sol = jax.block_until_ready(solve(graph, init))
    warm = time.perf_counter() - t0
    covs = rr.graph_laplace(graph, sol)["x"]
    gn_covs = rr.graph_laplace(graph, sol, curvature="gauss_newton")["x"]
    # --8<-- [end:solve]

    x = np.asarray(sol.value["x"])
    sd_last = np.sqrt(np.diag(np.asarray(covs[-1])))
    results = {
        "poses": poses,
        "closures": len(problem.closures),
        "result": str(rr.RESULTS[sol.result]),
        "steps": int(sol.stats["num_steps"]),
        "steps_accepted": int(sol.stats["num_accepted"]),
        "first_call_s": first,
        "warm_solve_s": warm,
        "dead_reckoning": errors(start, problem.truth),
        "solve_graph": errors(x, problem.truth),
        "last_pose_sd": [float(v) for v in sd_last],
        "hessian_vs_gauss_newton_marginals": float(
            np.abs(covs - gn_covs).max() / np.abs(gn_covs).max()
        ),
    }
    peer = gtsam_answers(problem, start, x)
    if peer is not None:
        results["gtsam"] = {
            "lm_iterations": peer["lm"][1],
            "lm_tight_iterations": peer["lm_tight"][1],
            "max_dx_vs_lm_tight": pose_difference(x, peer["lm_tight"][0]),
            "lm_default_vs_lm_tight": pose_difference(
                peer["lm"][0], peer["lm_tight"][0]
            ),
            "marginals_max_relative_difference": float(
                np.max(
                    np.abs(np.asarray(gn_covs) - peer["marginals"]).max(axis=(1, 2))
                    / np.abs(peer["marginals"]).max(axis=(1, 2))
                )
            ),
        }
    results = rounded(results)
    print(json.dumps(results, indent=2))
    if plot_path:
        title = f"Pose2 graph: {poses} poses, {len(problem.closures)} loop closures"
        plot(problem, start, x, np.asarray(covs), plot_path, title)
    if json_path:
        pathlib.Path(json_path).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--poses", type=int, default=None)
    parser.add_argument("--closures", type=int, default=None)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--plot", default=None, help="write the figure here")
    parser.add_argument("--json", default=None, help="write the numbers here")
    args = parser.parse_args()
    main(args.smoke, args.poses, args.closures, args.plot, args.json)
