"""A factor graph of learned relations: tracking a two-link arm.

A diffusion model learns the joint space z = (q1, q2, x, y) of a planar
two-link arm (links 0.6 and 0.5: the end effector (x, y) is the forward
kinematics of the joint angles (q1, q2)). Nothing tells it the kinematics: it
sees samples. The relation then serves as one factor per pose in a graph
over a trajectory of T poses:

    q_0 -- q_1 -- ... -- q_{T-1}       smoothness between neighbouring poses
     |      |              |
    R_0    R_1    ...    R_{T-1}      the learned arm relation over (q_t, xy_t)
     |      |              |
    xy_0   xy_1   ...   xy_{T-1}      a noisy measurement of each end effector

The graph is solved jointly (Newton on the graph's block-tridiagonal
Jacobian, one jitted call) and by loopy Gaussian belief propagation; the two
agree, and both recover the joint angles that no sensor measured. The plot
shows the true and measured tracks, the estimate and the Laplace belief
ellipses of the end effector.

Run: `python examples/arm_pose_graph.py` (`--smoke` for a cheap run; the
numbers it prints are written to `docs/assets/arm_pose_graph.json`).
"""

import argparse
import json
import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import retrax.diffusion as rd
import retrax.relations as rr


LINKS = (0.6, 0.5)
Q1, Q2 = (-1.2, 1.2), (0.3, 2.4)
NOISE = 0.005
SENSOR_SD = 0.02
# the smoothness prior's sd of a pose-to-pose change of the joint angles: the
# track's sampling makes the changes about 10 / poses, so this scales with it
SMOOTH_SPAN = 20.0


def smooth_sd(poses):
    return SMOOTH_SPAN / poses


def kinematics(q):
    """The end effector of joint angles `q` (`(..., 2)`)."""
    a, b = q[..., 0], q[..., 0] + q[..., 1]
    return jnp.stack(
        [
            LINKS[0] * jnp.cos(a) + LINKS[1] * jnp.cos(b),
            LINKS[0] * jnp.sin(a) + LINKS[1] * jnp.sin(b),
        ],
        axis=-1,
    )


def arm_data(key, n=20000, dtype=jnp.float32):
    """Samples of (q1, q2, x, y) over the workspace, with `NOISE` on each."""
    k1, k2, k3 = jax.random.split(key, 3)
    q = jnp.stack(
        [
            jax.random.uniform(k1, (n,), dtype, *Q1),
            jax.random.uniform(k2, (n,), dtype, *Q2),
        ],
        axis=1,
    )
    z = jnp.concatenate([q, kinematics(q)], axis=1)
    return z + NOISE * jax.random.normal(k3, z.shape, dtype)


def train_arm(key, steps):
    """The arm's noise predictor, trained by denoising score matching."""
    k_data, k_model, k_fit = jax.random.split(key, 3)
    data = arm_data(k_data)
    model = rd.TimeMLP(4, hidden=128, depth=3, key=k_model, dtype=jnp.float32)
    pred = rd.NoisePredictor(model, rd.VPSDE())
    pred = rd.fit(
        pred, data, k_fit, steps=steps, batch_size=512, ema=0.995, progress=False
    ).value
    return pred


def to_dtype(tree, dtype):
    return jax.tree.map(
        lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, tree
    )


def arm_factor(pred, key, dtype=jnp.float64, samples=1):
    """The learned relation as a factor with channels q (2) and xy (2)."""
    nodes = rr.field_nodes(key, 4, samples=samples, dtype=dtype)
    relation = rr.ImplicitDiffusion(to_dtype(pred, dtype), nodes)
    return rr.Factor(relation, {"q": 2, "xy": 2})


def track(key, poses, dtype=jnp.float64):
    """A smooth joint trajectory inside the workspace, its end effectors and
    their noisy measurements."""
    t = jnp.linspace(0, 1, poses, dtype=dtype)
    q = jnp.stack(
        [0.7 * jnp.sin(2 * jnp.pi * t), 1.35 + 0.7 * jnp.cos(3 * jnp.pi * t)], axis=1
    )
    xy = kinematics(q)
    return q, xy, xy + SENSOR_SD * jax.random.normal(key, xy.shape, dtype)


# --8<-- [start:graph]
def pose_graph(factor, measured):
    """Poses q_t and end effectors xy_t: the relation per pose, a measurement
    of each end effector, smoothness between neighbouring poses."""
    poses = measured.shape[0]
    rows = range(poses)
    return rr.FactorGraph(
        {"q": (poses, 2), "xy": (poses, 2)},
        [
            rr.RelationFactor(factor, {"q": ("q", rows), "xy": ("xy", rows)}),
            rr.GaussianFactor([("xy", rows)], jnp.eye(2), measured, SENSOR_SD**-2),
            rr.GaussianFactor.between(
                ("q", range(poses - 1)),
                ("q", range(1, poses)),
                smooth_sd(poses) ** -2,
                dim=2,
            ),
        ],
    )


# --8<-- [end:graph]


def start(measured):
    """A start for every pose: the middle of the joint ranges, the measured
    end effectors."""
    poses = measured.shape[0]
    q0 = jnp.broadcast_to(jnp.array([0.0, 1.35], measured.dtype), (poses, 2))
    return {"q": q0, "xy": measured}


def plot(q_est, xy_true, measured, xy_est, covs, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Ellipse

    fig, ax = plt.subplots(figsize=(6, 5))
    ax.plot(*np.asarray(xy_true).T, "k-", lw=1, label="true end effector")
    ax.plot(*np.asarray(measured).T, ".", ms=3, color="tab:gray", label="measured")
    ax.plot(*np.asarray(xy_est).T, "-", color="tab:red", lw=1, label="joint solve: xy")
    ax.plot(
        *np.asarray(kinematics(q_est)).T,
        "-",
        color="tab:green",
        lw=1.5,
        label="kinematics of the solved angles",
    )
    for i in range(0, len(xy_est), max(1, len(xy_est) // 25)):
        vals, vecs = np.linalg.eigh(np.asarray(covs[i]))
        angle = np.degrees(np.arctan2(vecs[1, 1], vecs[0, 1]))
        w, h = 2 * 3 * np.sqrt(np.maximum(vals[::-1], 0))
        ax.add_patch(
            Ellipse(
                np.asarray(xy_est[i]),
                w,
                h,
                angle=angle,
                fill=False,
                color="tab:blue",
                lw=0.8,
            )
        )
    ax.plot([], [], color="tab:blue", lw=0.8, label="3-sd Laplace belief")
    ax.set_aspect("equal")
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title("two-link arm: a graph of learned relations")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(smoke=False, plot_path=None, json_path=None, seed=0):
    jax.config.update("jax_enable_x64", True)
    k_train, k_nodes, k_track = jax.random.split(jax.random.key(seed), 3)
    steps, poses = (300, 8) if smoke else (8000, 100)

    t0 = time.perf_counter()
    pred = train_arm(k_train, steps)
    train_s = time.perf_counter() - t0
    print(f"trained the arm relation for {steps} steps in {train_s:.1f} s")

    factor = arm_factor(pred, k_nodes)
    q_true, xy_true, measured = track(k_track, poses)
    graph = pose_graph(factor, measured)
    init = start(measured)

    solve = eqx.filter_jit(lambda g, i: rr.solve_graph(g, i, throw=False))
    sol = solve(graph, init)
    jax.block_until_ready(sol.x)
    t0 = time.perf_counter()
    sol = jax.block_until_ready(solve(graph, init))
    solve_s = time.perf_counter() - t0
    covs = eqx.filter_jit(rr.graph_laplace)(graph, sol)
    bp = eqx.filter_jit(
        lambda g, i: rr.propagate_beliefs(
            g, i, schedule="sequential", tol=1e-8, max_steps=300, throw=False
        )
    )(graph, init)

    q_err = float(jnp.sqrt(jnp.mean((sol.value["q"] - q_true) ** 2)))
    xy_err = float(jnp.sqrt(jnp.mean((sol.value["xy"] - xy_true) ** 2)))
    meas_err = float(jnp.sqrt(jnp.mean((measured - xy_true) ** 2)))
    kin_err = float(
        jnp.sqrt(jnp.mean((kinematics(sol.value["q"]) - sol.value["xy"]) ** 2))
    )
    bp_gap = float(jnp.max(jnp.abs(bp.x - sol.x)))
    results = {
        "poses": poses,
        "train_steps": steps,
        "joint_result": str(rr.RESULTS[sol.result]) or "successful",
        "joint_steps": int(sol.stats["num_steps"]),
        "joint_solve_s": solve_s,
        "bp_result": str(rr.RESULTS[bp.result]) or "successful",
        "bp_steps": int(bp.stats["num_steps"]),
        "q_rmse": q_err,
        "xy_rmse": xy_err,
        "measurement_rmse": meas_err,
        "kinematics_rmse": kin_err,
        "bp_minus_joint_max": bp_gap,
        "xy_sd_median": float(
            jnp.median(jnp.sqrt(jnp.diagonal(covs["xy"], axis1=1, axis2=2)))
        ),
    }
    for k, v in results.items():
        print(f"{k:>22}: {v}")
    if plot_path:
        plot(sol.value["q"], xy_true, measured, sol.value["xy"], covs["xy"], plot_path)
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
