"""Two learned relations sharing a variable, queried and trained jointly.

Two small diffusion models learn two relations from synthetic points: a
circle over (x, y) (the unit circle) and a line over (y, z)
(z = 0.5 y + 0.3). Placed on the joint state (x, y, z) by
`named_relation` and multiplied by `ProductRelation`, they answer "x is
0.6: what are y and z?" as one stable root of the summed noise fields: y on
the circle's branch the start selects, z on the line at that y.

Then the line's parameters are trained *through* the joint inference: the
loss is the distance of the inferred z to given targets, and its gradient
with respect to the line network's weights comes from the implicit function
theorem (one transposed linear solve at the answer of the product), fed to
Adam. The circle stays fixed; the line bends until the answers hit the
targets.

Run: `python examples/two_relations.py` (add `--smoke` for a few-second check).
"""

import argparse
import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

import retrax.diffusion as rd
import retrax.relations as rr


BLOCKS = {"x": 1, "y": 1, "z": 1}
# (clamped x, start y, target z); the starts select the circle's upper branch.
# The target y is the circle's own answer, sqrt(1 - x^2): the line must move z
# without pulling the shared y off the circle.
QUERIES = [(0.6, 0.5, 0.95), (0.0, 0.7, 1.15)]
DEFAULT_PLOT = pathlib.Path(__file__).parent.parent / "docs/assets/two_relations.png"


def circle_data(key, n=4096, noise=0.02):
    k1, k2 = jax.random.split(key)
    angle = jax.random.uniform(k1, (n,), jnp.float32, 0, 2 * jnp.pi)
    points = jnp.stack([jnp.cos(angle), jnp.sin(angle)], axis=1)
    return points + noise * jax.random.normal(k2, (n, 2), jnp.float32)


def line_data(key, n=4096, noise=0.02):
    k1, k2 = jax.random.split(key)
    y = jax.random.uniform(k1, (n,), jnp.float32, -1.5, 1.5)
    points = jnp.stack([y, 0.5 * y + 0.3], axis=1)
    return points + noise * jax.random.normal(k2, (n, 2), jnp.float32)


def to_float64(tree):
    return jax.tree.map(
        lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x, tree
    )


def joint(circle, line):
    """The product relation over (x, y, z)."""
    return rr.ProductRelation(
        [
            rr.named_relation(circle, ["x", "y"], BLOCKS),
            rr.named_relation(line, ["y", "z"], BLOCKS),
        ]
    )


RHO = rr.assemble_state(BLOCKS, {"y": 0.0, "z": 0.0}, fill=jnp.inf)


def answers(circle, line):
    """Clamp x, infer (y, z): one vmapped solve over the queries."""
    z0 = jnp.array([[x, y, 0.0] for x, y, _ in QUERIES])
    model = joint(circle, line)
    return jax.vmap(lambda q: rr.implicit_infer(model, q, RHO, tol=1e-10))(z0)


def plot(data_c, data_l, before, after, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4.5))
    a1.plot(data_c[:800, 0], data_c[:800, 1], ".", ms=2, color="0.7", label="data")
    a1.plot(before[:, 0], before[:, 1], "o", mfc="none", mec="tab:blue")
    a1.plot(after[:, 0], after[:, 1], "o", color="tab:red")
    a1.set_xlabel("x (clamped)")
    a1.set_ylabel("y")
    a1.set_title("circle relation over (x, y)")
    a1.set_aspect("equal")
    a2.plot(data_l[:800, 0], data_l[:800, 1], ".", ms=2, color="0.7", label="data")
    a2.plot(before[:, 1], before[:, 2], "o", mfc="none", mec="tab:blue", label="before")
    a2.plot(after[:, 1], after[:, 2], "o", color="tab:red", label="after training")
    targets = np.array([[np.sqrt(1 - x**2), t] for x, _, t in QUERIES])
    a1.plot([x for x, _, _ in QUERIES], targets[:, 0], "x", color="k", ms=9)
    a2.plot(targets[:, 0], targets[:, 1], "x", color="k", ms=9, label="targets")
    a2.set_xlabel("y (shared)")
    a2.set_ylabel("z")
    a2.set_title("line relation over (y, z)")
    a2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(
    smoke: bool = False, plot_path: str | None = str(DEFAULT_PLOT), seed: int = 0
) -> dict:
    jax.config.update("jax_enable_x64", True)
    key = jax.random.key(seed)
    kc, kl, kmc, kml, kfc, kfl, kn = jax.random.split(key, 7)
    fit_steps = 100 if smoke else 6000
    train_steps = 5 if smoke else 300

    # Two small noise predictors, trained in float32 by denoising score matching.
    start = time.perf_counter()
    data_c, data_l = circle_data(kc), line_data(kl)
    preds = []
    for data, km, kf in [(data_c, kmc, kfc), (data_l, kml, kfl)]:
        net = rd.TimeMLP(2, hidden=48, key=km, dtype=jnp.float32)
        run = rd.fit(
            rd.NoisePredictor(net, rd.VPSDE()),
            data,
            kf,
            steps=fit_steps,
            progress=False,
        )
        preds.append(run.value)
    fit_s = time.perf_counter() - start
    print(f"fitted the circle and the line ({fit_steps} steps each) in {fit_s:.1f} s")

    # Relations in float64, K = 8 levels x 4 draws x 2 (antithetic) = 64 nodes.
    nodes = rr.field_nodes(kn, 2, dtype=jnp.float64)
    circle = rr.ImplicitDiffusion(to_float64(preds[0]), nodes)
    line = rr.ImplicitDiffusion(to_float64(preds[1]), nodes)

    sols = eqx.filter_jit(answers)(circle, line)
    before = np.asarray(sols.value)
    print("\nclamp x, infer (y, z) on the product of the two relations:")
    print("  x     | y       | z       | line 0.5y+0.3 | radius (x, y) | conv | stable")
    for q, z in enumerate(before):
        print(
            f"  {z[0]:.2f}  | {z[1]:+.4f} | {z[2]:+.4f} | {0.5 * z[1] + 0.3:+.4f}"
            f"       | {np.hypot(z[0], z[1]):.4f}        "
            f"| {bool(sols.converged[q])!s:4} | {bool(sols.stable[q])}"
        )

    # Train the line through joint inference: d loss / d weights by the IFT.
    targets = jnp.array([[np.sqrt(1 - x**2), t] for x, _, t in QUERIES])
    # Only the line network's weights are trained: the nodes and lam stay fixed.
    p, static_pred = eqx.partition(line.pred, eqx.is_inexact_array)

    def with_pred(p):
        return eqx.tree_at(lambda r: r.pred, line, eqx.combine(p, static_pred))

    def loss_of_pred(p):
        sols = answers(circle, with_pred(p))
        return jnp.mean((sols.value[:, 1:] - targets) ** 2)

    opt = optax.adam(3e-3)
    state = opt.init(p)

    @eqx.filter_jit
    def step(p, state):
        loss, grad = eqx.filter_value_and_grad(loss_of_pred)(p)
        updates, state = opt.update(grad, state, p)
        return eqx.apply_updates(p, updates), state, loss

    start = time.perf_counter()
    history = []
    print(
        f"\ntraining the line's weights through the joint inference (targets (y, z) = "
        f"{np.round(np.asarray(targets), 4).tolist()}):"
    )
    for i in range(train_steps):
        p, state, loss = step(p, state)
        history.append(float(loss))
        if i % max(1, train_steps // 6) == 0:
            print(f"  step {i:3d}  loss {float(loss):.3e}")
    line = with_pred(p)
    sols = eqx.filter_jit(answers)(circle, line)
    after = np.asarray(sols.value)
    final = float(jnp.mean((sols.value[:, 1:] - targets) ** 2))
    train_s = time.perf_counter() - start
    print(f"  final loss {final:.3e} ({train_steps} steps, {train_s:.1f} s)")
    print(
        "\n  x     | y       | z       | target (y, z)    | radius (x, y) "
        "| conv | stable"
    )
    for q, z in enumerate(after):
        print(
            f"  {z[0]:.2f}  | {z[1]:+.4f} | {z[2]:+.4f} | "
            f"({float(targets[q, 0]):+.3f}, {float(targets[q, 1]):+.3f}) | "
            f"{np.hypot(z[0], z[1]):.4f}        | {bool(sols.converged[q])!s:4} | "
            f"{bool(sols.stable[q])}"
        )
    if plot_path is not None:
        plot(np.asarray(data_c), np.asarray(data_l), before, after, plot_path)
        print(f"saved {pathlib.Path(plot_path).resolve()}")
    return {
        "before": before,
        "after": after,
        "targets": np.asarray(targets),
        "history": history,
        "final_loss": final,
        "converged": bool(jnp.all(sols.converged)),
        "stable": bool(jnp.all(sols.stable)),
        "fit_s": fit_s,
        "train_s": train_s,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few-second run")
    parser.add_argument("--plot", default=str(DEFAULT_PLOT), help="PNG output path")
    parser.add_argument("--seed", type=int, default=0, help="data, models, nodes")
    args = parser.parse_args()
    with jax.numpy_dtype_promotion("standard"):
        main(smoke=args.smoke, plot_path=args.plot, seed=args.seed)
