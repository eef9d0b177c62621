"""A learned relation: the unit circle, queried by implicit inference.

A 5,122-parameter MLP learns the noise of points on the unit circle (plus
0.02 noise) by denoising score matching. Used as a relation, it answers
"x is 0.6: what is y?" by finding a stable root of its noise field with x
clamped, on the branch the start selects. The derivative of a loss on the
answer with respect to the clamped input and to the network's weights comes
from the implicit function theorem: one transposed linear solve at the
answer, no pass back through the solver's iterations. It is checked here
against central finite differences in float64.

Run: `python examples/circle_mlp.py` (add `--smoke` for a few-second check).
"""

import argparse
import pathlib
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import retrax.diffusion as rd
import retrax.relations as rr


QUERIES = [
    # (clamped x, start y, the spec's answer y)
    (0.6, 0.5, 0.78),
    (0.6, -0.5, -0.77),
    (0.0, 0.7, 0.99),
]


def circle_data(key, n=4096, noise=0.02, dtype=jnp.float32):
    k1, k2 = jax.random.split(key)
    angle = jax.random.uniform(k1, (n,), dtype, 0, 2 * jnp.pi)
    points = jnp.stack([jnp.cos(angle), jnp.sin(angle)], axis=1)
    return points + noise * jax.random.normal(k2, (n, 2), dtype)


def to_float64(tree):
    return jax.tree.map(
        lambda x: x.astype(jnp.float64) if eqx.is_inexact_array(x) else x, tree
    )


# --8<-- [start:loss]
def answer_loss(relation, x, z0y):
    """`(y - 0.7)^2 / 2` of the answer to "x clamped, y from `z0y`"."""
    z0 = jnp.stack([x, z0y])
    sol = rr.implicit_infer(relation, z0, jnp.array([jnp.inf, 0.0]), tol=1e-13)
    return 0.5 * (sol.value[1] - 0.7) ** 2


# --8<-- [end:loss]


def plot(relation, answers, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = jnp.linspace(-1.4, 1.4, 29)
    xx, yy = jnp.meshgrid(grid, grid)
    points = jnp.stack([xx.ravel(), yy.ravel()], axis=1)
    field = jax.jit(jax.vmap(relation.prior_field))(points)
    # the field is roughly grad(-log p): plot its negative, the flow to the data
    u, v = -np.asarray(field).T
    fig, ax = plt.subplots(figsize=(5.5, 5.5))
    ax.quiver(points[:, 0], points[:, 1], u, v, np.hypot(u, v), cmap="viridis")
    theta = np.linspace(0, 2 * np.pi, 200)
    ax.plot(np.cos(theta), np.sin(theta), "k--", lw=0.8, label="unit circle")
    for (x, y0, _), z in zip(QUERIES, answers, strict=True):
        ax.plot([x], [y0], "o", mfc="none", mec="tab:red")
        ax.annotate("", xy=z, xytext=(x, y0), arrowprops={"arrowstyle": "->"})
        ax.plot([z[0]], [z[1]], "o", color="tab:red")
    ax.set_aspect("equal")
    ax.set_title("learned field $-g(z)$; queries (open) and answers (filled)")
    ax.legend(loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(smoke: bool = False, plot_path: str | None = None, seed: int = 0) -> dict:
    jax.config.update("jax_enable_x64", True)
    key = jax.random.key(seed)
    k_data, k_model, k_fit, k_nodes = jax.random.split(key, 4)
    steps = 2000 if smoke else 6000

    # --8<-- [start:train]
    # Train in float32, as one jitted scan per chunk of steps. Adam's last
    # iterate jitters at about its step size, and the answers with it (by
    # ~0.015 over a few tens of steps, as between seeds): keep the moving
    # average of the parameters over the last ~200 steps instead.
    start = time.perf_counter()
    data = circle_data(k_data)
    model = rd.TimeMLP(2, key=k_model, dtype=jnp.float32)
    pred = rd.NoisePredictor(model, rd.VPSDE())
    run = rd.fit(pred, data, k_fit, steps=steps, progress=False, ema=0.995)
    pred, losses = run.value, run.losses
    jax.block_until_ready(losses)
    train_s = time.perf_counter() - start
    # --8<-- [end:train]
    n_params = sum(p.size for p in jax.tree.leaves(eqx.filter(model, eqx.is_array)))
    print(f"trained {n_params} parameters for {steps} steps in {train_s:.1f} s")
    print(f"final loss (mean of last 200 steps): {float(jnp.mean(losses[-200:])):.4f}")

    # --8<-- [start:relation]
    # Query in float64, with K = 8 levels x 8 draws x 2 (antithetic) = 128 nodes.
    start = time.perf_counter()
    nodes = rr.field_nodes(k_nodes, 2, samples=8, dtype=jnp.float64)
    relation = rr.ImplicitDiffusion(to_float64(pred), nodes)
    rho = jnp.array([jnp.inf, 0.0])  # clamp x (infinitely stiff), y free
    # --8<-- [end:relation]
    h = 1e-5
    # --8<-- [start:adjoint]
    # The adjoint (implicit function theorem) derivative of the first query's
    # loss, with respect to the clamped x and to every weight.
    x, y0 = jnp.asarray(0.6), jnp.asarray(0.5)
    grad_model, grad_x = eqx.filter_jit(
        eqx.filter_grad(lambda args: answer_loss(args[0], args[1], y0))
    )((relation, x))
    # --8<-- [end:adjoint]
    g_hidden = grad_model.pred.model.layers[1].weight
    i, j = np.unravel_index(int(jnp.argmax(jnp.abs(g_hidden))), g_hidden.shape)
    weight = relation.pred.model.layers[1].weight

    def with_weight(v):
        return eqx.tree_at(
            lambda r: r.pred.model.layers[1].weight, relation, weight.at[i, j].set(v)
        )

    # One vmapped solve answers the table's queries and the central-difference
    # twins of the first one: x +- h, and the hidden weight +- h.
    cases = [(relation, [x_, y_]) for x_, y_, _ in QUERIES]
    cases += [(relation, [0.6 + h, 0.5]), (relation, [0.6 - h, 0.5])]
    cases += [(with_weight(weight[i, j] + h), [0.6, 0.5])]
    cases += [(with_weight(weight[i, j] - h), [0.6, 0.5])]
    relations = jax.tree.map(
        lambda *leaves: jnp.stack(leaves) if eqx.is_array(leaves[0]) else leaves[0],
        *[r for r, _ in cases],
    )
    z0 = jnp.array([q for _, q in cases])
    sols = eqx.filter_jit(
        eqx.filter_vmap(lambda r, q: rr.implicit_infer(r, q, rho, tol=1e-13))
    )(relations, z0)
    losses_fd = 0.5 * (sols.value[3:, 1] - 0.7) ** 2
    fd_x = (losses_fd[0] - losses_fd[1]) / (2 * h)
    fd_w = (losses_fd[2] - losses_fd[3]) / (2 * h)

    answers, rows = [], []
    print(
        "\n  x clamped | y start |  answer (x, y)     | radius | spec y | conv | stable"
    )
    for q, (xq, yq, spec) in enumerate(QUERIES):
        z = np.asarray(sols.value[q])
        radius = float(np.hypot(*z))
        conv, stable = bool(sols.converged[q]), bool(sols.stable[q])
        answers.append(z)
        rows.append(
            {
                "x": xq,
                "y0": yq,
                "y": float(z[1]),
                "spec_y": spec,
                "radius": radius,
                "converged": conv,
                "stable": stable,
                "steps": int(sols.stats["num_steps"][q]),
            }
        )
        print(
            f"  {xq:9.2f} | {yq:7.2f} | ({z[0]:+.4f}, {z[1]:+.4f}) | {radius:.4f} "
            f"| {spec:+.2f}  | {conv!s:4} | {stable}"
        )

    rel_x = abs(float(grad_x - fd_x)) / abs(float(fd_x))
    rel_w = abs(float(g_hidden[i, j] - fd_w)) / abs(float(fd_w))
    print("\nd/dθ of (y - 0.7)^2/2 at the first query: adjoint vs central differences")
    print(f"  clamped x:            {float(grad_x):+.10e} vs {float(fd_x):+.10e}")
    print(f"    relative difference {rel_x:.1e}")
    print(
        f"  hidden weight [{i},{j}]:  {float(g_hidden[i, j]):+.10e} vs "
        f"{float(fd_w):+.10e}"
    )
    print(f"    relative difference {rel_w:.1e}")

    jac = eqx.filter_jit(lambda r, z: r.prior_jacobian(z))(relation, sols.value[0])
    asym = float(jnp.linalg.norm(jac - jac.T) / jnp.linalg.norm(jac))
    print(
        f"\nJacobian asymmetry |J - J^T| / |J| at the first answer: {asym:.3f}"
        " (a learned field is not a gradient: the adjoint solve needs J^T)"
    )
    query_s = time.perf_counter() - start
    print(f"queries and derivative checks: {query_s:.1f} s")
    if plot_path is None:
        plot_path = pathlib.Path(__file__).parent / "outputs" / "circle_mlp.png"
        plot_path.parent.mkdir(exist_ok=True)
    if plot_path:
        plot(relation, answers, plot_path)
        print(f"saved {pathlib.Path(plot_path).resolve()}")
    return {
        "rows": rows,
        "grad_x_rel": rel_x,
        "grad_w_rel": rel_w,
        "asymmetry": asym,
        "train_s": train_s,
        "query_s": query_s,
        "loss": float(jnp.mean(losses[-200:])),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few-second run")
    parser.add_argument(
        "--plot", default=None, help="PNG output path (default examples/outputs/)"
    )
    parser.add_argument("--seed", type=int, default=0, help="data, model, nodes")
    args = parser.parse_args()
    main(smoke=args.smoke, plot_path=args.plot, seed=args.seed)
