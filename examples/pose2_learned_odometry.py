"""The Pose2 graph with a learned odometry factor.

A differential-drive robot drives two laps of a stadium-shaped track (two
straights, two half circles) and its wheel odometry reports each step as an
arc: a length and a turn. The wheels slip in turns, so the odometry
over-reports every turn, by a random fraction (8% on average, never
under), and reads straights almost exactly. Nobody hands the user
this model: they have calibration drives, readings paired with the motion
a motion-capture system measured, and the odometry's reported Pose2, which
GTSAM users give `BetweenFactorPose2`.

A diffusion model learns the joint space of (reading, error): the reading
`(length, turn)` and the between error `Logmap(m^{-1} x_i^{-1} x_j)` of the
reported Pose2 `m` against the true motion. Used as a relation with the
reading observed, it is the odometry factor of the graph of
`examples/pose2_graph.py` (a prior on pose 0, GTSAM's between error for
the loop closures): the error of step `i` is a variable family `e`, tied to
the poses by a stiff residual, and the relation scores it, one row per step.
The graph is solved jointly by `solve_graph` (Newton's method: the graph
holds a learned relation) and compared with the same graph whose odometry
factor is a Gaussian fitted to the same calibration data: one mean and
covariance for every step (what one GTSAM noise model holds), and a mean
and covariance per bin of the turn reading (a noise model per factor, for a
user who guesses that the turn is what matters).

Run: `python examples/pose2_learned_odometry.py` (`--smoke` for a cheap run;
`--plot` and `--json` write the figure and the numbers).
"""

import argparse
import json
import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from pose2_graph import (
    CLOSURE_SD,
    PRIOR_SD,
    between,
    between_residual,
    compose,
    errors,
    logmap,
    prior_residual,
    rounded,
)

import retrax.diffusion as rd
import retrax.relations as rr


STEP = 0.5  # m per odometry step
TRACK = (16, 20)  # steps along a straight, steps around a half circle
SLIP = (2.0, 0.04)  # the gamma distribution of the turn's over-reading
LENGTH_NOISE = 0.01  # relative
TURN_NOISE = 0.003  # rad
# the field nodes' diffusion times: noise sd 0.01 to 0.08 in the scaled units,
# finer than the default (to 0.17), for the straights' narrow errors
LEVELS = np.linspace(0.001, 0.02, 8)
LINK = 0.1  # the error variables' tie to the poses, in units of the error's sd


def arc(length, turn):
    """The relative Pose2 of an arc of `length` turning by `turn` (numpy)."""
    small = np.abs(turn) < 1e-9
    safe = np.where(small, 1.0, turn)
    dx = np.where(small, length, length * np.sin(safe) / safe)
    dy = np.where(small, length * turn / 2, length * (1 - np.cos(safe)) / safe)
    return np.stack([dx, dy, np.arctan2(np.sin(turn), np.cos(turn))], axis=-1)


def wheel_odometry(rng, length, turn):
    """The odometry's readings `(length, turn)` of arcs (the sensor's model,
    which the user never sees)."""
    slip = rng.gamma(*SLIP, size=np.shape(turn))
    noise = rng.normal(size=(2, *np.shape(turn)))
    return np.stack(
        [
            length * (1 + LENGTH_NOISE * noise[0]),
            turn * (1 + slip) + TURN_NOISE * noise[1],
        ],
        axis=-1,
    )


def between_error(reported, motion):
    """GTSAM's between error `Logmap(m^{-1} d)` of reported Pose2s `m`
    against motions `d`, `(..., 3)` (numpy)."""
    vec = jax.vmap(logmap) if np.ndim(reported) > 1 else logmap
    return np.asarray(vec(jnp.asarray(between(reported, motion))))


def calibration(rng, drives):
    """Calibration drives: random arcs, their readings and the between errors
    of the reported Pose2s against the true motions."""
    length = rng.uniform(0.2, 0.8, drives)
    turn = rng.uniform(-0.4, 0.4, drives)
    reading = wheel_odometry(rng, length, turn)
    error = between_error(arc(*reading.T), arc(length, turn))
    return reading, error


def track(rng, laps=2, closures=12):
    """Poses on `laps` laps of the stadium track, the odometry's readings of
    every step, and loop closures (noise `CLOSURE_SD`) from evenly spaced
    poses of the first lap to the same place on the next."""
    straight, half = TRACK
    turn = np.concatenate([np.zeros(straight), np.full(half, np.pi / half)] * 2 * laps)
    length = np.full(turn.shape, STEP)
    truth = [np.zeros(3)]
    for step in arc(length, turn):
        truth.append(compose(truth[-1], step))
    truth = np.stack(truth)
    reading = wheel_odometry(rng, length, turn)
    lap = 2 * (straight + half)
    first = np.linspace(0, lap - 1, closures).round().astype(np.int64)
    pairs = np.stack([first, first + lap], axis=1)
    meas = between(truth[pairs[:, 0]], truth[pairs[:, 1]])
    meas = meas + rng.normal(size=meas.shape) * np.asarray(CLOSURE_SD)
    return truth, reading, pairs, meas


def dead_reckoning(reported):
    """The poses composed from pose 0 and the reported steps alone."""
    out = [np.zeros(3)]
    for step in reported:
        out.append(compose(out[-1], step))
    return np.stack(out)


def shared_factors(truth, pairs, meas):
    """The prior on pose 0 and the loop closures, as in `pose2_graph.py`."""
    f = jnp.asarray
    return [
        rr.ResidualFactor([("x", [0])], prior_residual, (f(PRIOR_SD), f(truth[0]))),
        rr.ResidualFactor(
            [("x", pairs[:, 0]), ("x", pairs[:, 1])],
            between_residual,
            f(CLOSURE_SD),
            f(meas),
        ),
    ]


def gaussian_residual(_, row, xi, xj):
    """A Gaussian between error: `W (Logmap(m^{-1} x_i^{-1} x_j) - mean)`."""
    reported, mean, white = row
    return white @ (logmap(between(reported, between(xi, xj))) - mean)


def gaussian_graph(shared, reported, mean, cov):
    """The graph with a Gaussian odometry factor: one `mean` and `cov` per
    step (`(steps, 3)`, `(steps, 3, 3)`)."""
    steps = len(reported)
    white = np.linalg.inv(np.linalg.cholesky(cov))
    odometry = rr.ResidualFactor(
        [("x", range(steps)), ("x", range(1, steps + 1))],
        gaussian_residual,
        None,
        tuple(jnp.asarray(a) for a in (reported, mean, white)),
    )
    return rr.FactorGraph({"x": (steps + 1, 3)}, [*shared, odometry])


def by_turn(reading, error, bins=9):
    """The Gaussian per bin of the turn reading: a function from readings
    to each step's mean and covariance."""
    edges = np.linspace(-0.45, 0.45, bins + 1)[1:-1]
    which = np.digitize(reading[:, 1], edges)
    means = np.stack([error[which == b].mean(0) for b in range(bins)])
    covs = np.stack([np.cov(error[which == b].T) for b in range(bins)])

    def noise_model(readings):
        b = np.digitize(readings[:, 1], edges)
        return means[b], covs[b]

    return noise_model


# --8<-- [start:learned]
def link_residual(scale, reported, xi, xj, e):
    """Ties step `i`'s error variable `e` (in units of the calibration
    errors' sd, `scale`) to the poses: `(Logmap(m^{-1} x_i^{-1} x_j) / scale
    - e) / LINK`."""
    return (logmap(between(reported, between(xi, xj))) / scale - e) / LINK


def learned_graph(shared, reported, reading, factor, normalise):
    """The graph with the learned odometry factor: error variables `e`, one
    per step, tied to the poses, and the relation over (reading, error) with
    the reading observed."""
    steps = len(reported)
    rows = range(steps)
    (r_mean, r_sd), e_sd = normalise
    link = rr.ResidualFactor(
        [("x", rows), ("x", range(1, steps + 1)), ("e", rows)],
        link_residual,
        jnp.asarray(e_sd),
        jnp.asarray(reported),
    )
    odometry = rr.RelationFactor(
        factor,
        connect={"error": ("e", rows)},
        observed={"reading": jnp.asarray((reading - r_mean) / r_sd)},
    )
    return rr.FactorGraph(
        {"x": (steps + 1, 3), "e": (steps, 3)}, [*shared, link, odometry]
    )


# --8<-- [end:learned]


# --8<-- [start:train]
def train_odometry(key, reading, error, steps):
    """A noise predictor on (reading, error), each coordinate scaled to unit
    spread, trained by denoising score matching; the relation's factor with
    channels `reading` (2) and `error` (3), in float64, and the scaling."""
    k_model, k_fit, k_nodes = jax.random.split(key, 3)
    normalise = ((reading.mean(0), reading.std(0)), error.std(0))
    (r_mean, r_sd), e_sd = normalise
    data = np.concatenate([(reading - r_mean) / r_sd, error / e_sd], axis=1)
    model = rd.TimeMLP(5, hidden=128, depth=3, key=k_model, dtype=jnp.float32)
    pred = rd.NoisePredictor(model, rd.VPSDE())
    pred = rd.fit(
        pred,
        jnp.asarray(data, jnp.float32),
        k_fit,
        steps=steps,
        batch_size=512,
        ema=0.995,
        progress=False,
    ).value
    pred = jax.tree.map(
        lambda a: a.astype(jnp.float64) if eqx.is_inexact_array(a) else a, pred
    )
    nodes = rr.field_nodes(k_nodes, 5, LEVELS, samples=1, dtype=jnp.float64)
    factor = rr.Factor(rr.ImplicitDiffusion(pred, nodes), {"reading": 2, "error": 3})
    return factor, normalise


# --8<-- [end:train]


def coverage(poses, covs, truth) -> float:
    """The fraction of poses whose true position lies inside the 99% ellipse
    of its Laplace marginal."""
    err = np.asarray(poses)[:, :2] - truth[:, :2]
    prec = np.linalg.inv(np.asarray(covs)[:, :2, :2])
    return float(np.mean(np.einsum("ni,nij,nj->n", err, prec, err) <= 9.2103))


def one_track(seed, solve, laplace, models):
    """Every odometry model's answer on one track (random readings and
    closures from `seed`): the poses and their errors against the truth."""
    truth, reading, pairs, meas = track(np.random.default_rng(seed))
    reported = arc(*reading.T)
    steps = len(reported)
    shared = shared_factors(truth, pairs, meas)
    start = dead_reckoning(reported)
    out = {"truth": truth, "dead reckoning": {"poses": start, **errors(start, truth)}}
    mean, cov = models["one Gaussian"]
    graphs = {
        "one Gaussian": gaussian_graph(
            shared, reported, np.tile(mean, (steps, 1)), np.tile(cov, (steps, 1, 1))
        ),
        "Gaussian per turn": gaussian_graph(
            shared, reported, *models["Gaussian per turn"](reading)
        ),
    }
    for name, graph in graphs.items():
        sol = solve(graph, {"x": start})
        out[name] = {"poses": np.asarray(sol.value["x"]), "sol": sol, "graph": graph}
    if "learned" in models:
        factor, normalise = models["learned"]
        # start at the one-Gaussian answer, the error variables at its errors
        x0 = out["one Gaussian"]["poses"]
        e0 = between_error(reported, between(x0[:-1], x0[1:])) / normalise[1]
        graph = learned_graph(shared, reported, reading, factor, normalise)
        t0 = time.perf_counter()
        sol = jax.block_until_ready(solve(graph, {"x": x0, "e": e0}))
        out["learned"] = {
            "poses": np.asarray(sol.value["x"]),
            "sol": sol,
            "graph": graph,
            "solve_s": time.perf_counter() - t0,
        }
    for r in out.values():
        if isinstance(r, dict) and "sol" in r:
            sol = r.pop("sol")
            covs = laplace(r.pop("graph"), sol)["x"]
            r.update(errors(r["poses"], truth))
            r["result"] = str(rr.RESULTS[sol.result])
            r["steps"] = int(sol.stats["num_steps"])
            r["coverage_99"] = coverage(r["poses"], covs, truth)
    return out


def plot(track_out, path):
    """Left: the first track's truth and answers. Right: their position
    errors along the track."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    truth = track_out["truth"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.4))
    styles = {
        "dead reckoning": ("--", "tab:gray"),
        "one Gaussian": ("-", "tab:orange"),
        "Gaussian per turn": ("-", "tab:green"),
        "learned": ("-", "tab:red"),
    }
    ax.plot(*truth[:, :2].T, "k-", lw=1.5, label="truth")
    for name, (style, color) in styles.items():
        if name in track_out:
            poses = track_out[name]["poses"]
            ax.plot(*poses[:, :2].T, style, color=color, lw=1, label=name)
            err = np.hypot(*(poses[:, :2] - truth[:, :2]).T)
            bx.plot(err, style, color=color, lw=1, label=name)
    ax.set_aspect("equal")
    ax.legend(loc="center", fontsize=8)
    ax.set_title("two laps of a stadium track, wheel odometry", fontsize=10)
    straight, half = TRACK
    for start in range(straight, len(truth), straight + half):
        bx.axvspan(start, start + half, color="0.92", lw=0)
    bx.plot([], [], "s", color="0.92", label="turning")
    bx.set_xlabel("pose")
    bx.set_ylabel("position error (m)")
    bx.set_yscale("log")
    bx.set_ylim(bottom=1e-3)  # pose 0 sits on its prior
    bx.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(smoke=False, plot_path=None, json_path=None, seed=0):
    jax.config.update("jax_enable_x64", True)
    train_steps, tracks = (300, 1) if smoke else (8000, 10)
    rng = np.random.default_rng(seed)
    reading, error = calibration(rng, 20000)
    t0 = time.perf_counter()
    factor, normalise = train_odometry(
        jax.random.key(seed), reading, error, train_steps
    )
    train_s = time.perf_counter() - t0
    print(f"trained the odometry relation for {train_steps} steps in {train_s:.1f} s")
    models = {
        "one Gaussian": (error.mean(0), np.cov(error.T)),
        "Gaussian per turn": by_turn(reading, error),
        "learned": (factor, normalise),
    }
    solve = eqx.filter_jit(lambda g, i: rr.solve_graph(g, i, throw=False))
    laplace = eqx.filter_jit(rr.graph_laplace)
    runs = [one_track(100 + k, solve, laplace, models) for k in range(tracks)]
    names = ["dead reckoning", "one Gaussian", "Gaussian per turn", "learned"]
    keys = ["position_rmse", "heading_rmse", "coverage_99"]
    results = {
        "train_steps": train_steps,
        "train_s": train_s,
        "tracks": tracks,
        "poses": len(runs[0]["truth"]),
        "mean over tracks": {
            name: {
                k: float(np.mean([r[name][k] for r in runs]))
                for k in keys
                if k in runs[0][name]
            }
            for name in names
        },
        "learned better than one Gaussian": sum(
            r["learned"]["position_rmse"] < r["one Gaussian"]["position_rmse"]
            for r in runs
        ),
        "learned better than Gaussian per turn": sum(
            r["learned"]["position_rmse"] < r["Gaussian per turn"]["position_rmse"]
            for r in runs
        ),
        "learned results": sorted({r["learned"]["result"] for r in runs}),
        "learned Newton steps": [r["learned"]["steps"] for r in runs],
        "learned solve s (median over tracks)": float(
            np.median([r["learned"]["solve_s"] for r in runs])
        ),
        "position_rmse by track": {
            name: [r[name]["position_rmse"] for r in runs] for name in names
        },
    }
    results = rounded(results)
    print(json.dumps(results, indent=2))
    if plot_path:
        plot(runs[0], plot_path)
    if json_path:
        pathlib.Path(json_path).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--plot", default=None, help="write the figure here")
    parser.add_argument("--json", default=None, help="write the numbers here")
    args = parser.parse_args()
    main(smoke=args.smoke, plot_path=args.plot, json_path=args.json)
