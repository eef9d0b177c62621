"""How the field-node levels set a learned relation's beliefs: the two-link arm.

The arm relation of `examples/arm_pose_graph.py` (z = (q1, q2, x, y), the end
effector the forward kinematics of the joint angles, data noise 0.005) is
asked a sensor-only question: the end effector is measured with sd 0.02 and
the joint angles are latent. Linearised, the true belief about the joint
angles is N(q, J^{-1} Sigma J^{-T}) with J the kinematics Jacobian and
Sigma = 0.02^2 I. For each choice of field-node levels this prints, over a
grid of true poses inside the workspace, the ratio of the Laplace belief's sd
(`factor_messages` on q) to that truth, per coordinate (for `belief_levels`
also with the nodes' smoothing removed: `ImplicitDiffusion(...,
deblur=True)`), and the bias: how far
the answer's end effector lies from the kinematics of its joint angles, and
how far its joint angles lie from the true ones.

Run: `python examples/arm_beliefs.py` (`--smoke` for a cheap run; `--json`
writes the numbers, `docs/assets/arm_beliefs.json` holds those of the
theory page's table).
"""

import argparse
import json
import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from arm_pose_graph import SENSOR_SD, arm_data, kinematics, to_dtype, train_arm

import retrax.relations as rr


# q1 in [-1.2, 1.2] and q2 in [0.3, 2.4] are the workspace; the poses keep
# inside it (the linearised truth is the belief of a point well within the data)
POSES = tuple((q1, q2) for q1 in (-0.8, 0.0, 0.8) for q2 in (0.7, 1.35, 2.0))


def level_choices(schedule, data):
    """The levels compared: the default, two from the data and two fixed."""
    return {
        "default": None,
        "data_levels": rr.data_levels(schedule, data[:3000]),
        "0.002-0.005": jnp.array([0.002, 0.003, 0.004, 0.005]),
        "belief_levels": rr.belief_levels(schedule, data),
    }


def sensor_only(factor, q_true):
    """The sensor-only query at a true pose: the belief's sd over the
    linearised truth's, the answer's kinematic miss and joint error."""
    xy = kinematics(q_true)
    marks = {
        "q": rr.Latent(jnp.array([0.0, 1.35], q_true.dtype)),
        "xy": rr.Unobserved(xy, SENSOR_SD**-2),
    }
    sol = rr.factor_infer(factor, marks, dtype=q_true.dtype, throw=False)
    msg = rr.factor_messages(factor, sol, marks, dtype=q_true.dtype)["q"]
    sd = jnp.sqrt(jnp.diag(jnp.linalg.inv(msg.precision)))
    jinv = jnp.linalg.inv(jax.jacfwd(kinematics)(q_true))
    truth = SENSOR_SD * jnp.sqrt(jnp.diag(jinv @ jinv.T))
    q, xy_est = sol.value[:2], sol.value[2:]
    return {
        "ratio": sd / truth,
        "kinematic_miss": jnp.linalg.norm(kinematics(q) - xy_est),
        "q_error": jnp.linalg.norm(q - q_true),
        "ok": sol.converged & sol.stable,
    }


def measure(pred, data, key, poses=POSES, dtype=jnp.float64):
    """Per level choice: the levels, their noise sd and the queries' numbers."""
    pred = to_dtype(pred, dtype)
    data = data.astype(dtype)
    schedule = pred.schedule
    q_true = jnp.asarray(poses, dtype)
    out = {}
    query = eqx.filter_jit(eqx.filter_vmap(sensor_only, in_axes=(None, 0)))
    for name, levels in level_choices(schedule, data).items():
        nodes = rr.field_nodes(key, 4, levels=levels, dtype=dtype)
        t = jnp.unique(nodes.t)
        # the calibrated levels also with their own smoothing removed
        variants = {name: False, f"{name}, deblur": True}
        for label, deblur in variants.items():
            if deblur and name != "belief_levels":
                continue
            model = rr.ImplicitDiffusion(pred, nodes, deblur=deblur)
            res = query(rr.Factor(model, {"q": 2, "xy": 2}), q_true)
            out[label] = {
                "levels": np.asarray(t).tolist(),
                "noise_sd": np.asarray(schedule.sigma(t) / schedule.alpha(t)).tolist(),
                **{k: np.asarray(v).tolist() for k, v in res.items()},
            }
    return out


def table(results):
    """A markdown table of the measured numbers."""
    lines = [
        "| levels | noise sd | sd ratio q1 (median, max) | sd ratio q2 (median, max) "
        "| kinematic miss (median, max) | joint error (median) |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        ratio = np.asarray(r["ratio"])
        miss = np.asarray(r["kinematic_miss"])
        sd = r["noise_sd"]
        lines.append(
            f"| `{name}` | {min(sd):.4f}-{max(sd):.4f} "
            f"| {np.median(ratio[:, 0]):.2f}, {ratio[:, 0].max():.2f} "
            f"| {np.median(ratio[:, 1]):.2f}, {ratio[:, 1].max():.2f} "
            f"| {np.median(miss):.4f}, {miss.max():.4f} "
            f"| {np.median(r['q_error']):.3f} |"
        )
    return "\n".join(lines)


def main(smoke=False, json_path=None, seed=0):
    jax.config.update("jax_enable_x64", True)
    k_train, k_nodes = jax.random.split(jax.random.key(seed))
    steps = 300 if smoke else 20000
    t0 = time.perf_counter()
    pred = train_arm(k_train, steps)
    train_s = time.perf_counter() - t0
    print(f"trained the arm relation for {steps} steps in {train_s:.0f} s")
    # the training data of `train_arm`
    data = arm_data(jax.random.split(k_train, 3)[0])
    poses = POSES[:2] if smoke else POSES
    results = measure(pred, data, k_nodes, poses)
    print(table(results))
    if json_path:
        payload = {"train_steps": steps, "poses": poses, "results": results}
        pathlib.Path(json_path).write_text(json.dumps(payload, indent=1) + "\n")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", default=None, help="write the numbers here")
    args = parser.parse_args()
    main(smoke=args.smoke, json_path=args.json)
