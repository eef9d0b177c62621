"""Relations in a factor graph: answers by passing messages, checked against
the joint solve.

Three scalar variables a, b, c; two relations, R1 over (a, b) and R2 over
(b, c), each an energy network with a quadratic energy (a correlated
Gaussian, so that message passing is exact and the check is sharp); and a
linear-Gaussian measurement y = h c + noise. The graph

    a -- R1 -- b -- R2 -- c -- measurement

is solved by iterating messages: each relation is a `Factor` whose query
marks a channel `Unobserved` with the incoming message as its evidence (or
`Latent` when nothing has arrived yet), and `factor_messages` returns what
the relation says about each channel with that evidence divided out. The
beliefs (products of the messages a variable receives) are compared with the
Laplace belief of one joint solve of the product of the two relations with
the measurement as a soft input: they agree to rounding. Last, the same
graph for the engine (`rr.FactorGraph`, solved by `rr.solve_graph` and
`rr.propagate_beliefs`), which agrees too.

Run: `python examples/factor_graph.py` (`--smoke` is the same, cheap run).
"""

import argparse

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import retrax.diffusion as rd
import retrax.relations as rr


SCHED = rd.VPSDE()
BLOCKS = {"a": 1, "b": 1, "c": 1}
H, NOISE, Y = 2.0, 0.3, 1.1  # the measurement y = h c + N(0, noise^2)


class Quadratic(eqx.Module):
    """The energy 0.5 (x - m)^T P (x - m) of a Gaussian relation."""

    precision: jax.Array
    mean: jax.Array

    def __call__(self, x, t):
        d = x - self.mean
        return 0.5 * d @ self.precision @ d


def relation(precision, mean):
    """A two-channel Gaussian relation N(mean, precision^-1) in data units."""
    nodes = rr.noisefree_nodes(2, 0.01)
    alpha = SCHED.alpha(jnp.asarray(0.01))
    # The field of E(alpha z) at one noise-free node is the data-unit score
    # of N(mean, precision^-1) with `lam = density_lambda`.
    net = Quadratic(jnp.asarray(precision) / alpha**2, alpha * jnp.asarray(mean))
    pred = rd.EnergyNetwork(net, SCHED)
    return rr.ImplicitDiffusion(pred, nodes, lam=rr.density_lambda(SCHED, nodes))


# --8<-- [start:factors]
def graph():
    """The two factors and the measurement's message to c."""
    r1 = rr.Factor(relation([[2.0, 1.2], [1.2, 1.5]], [0.5, -0.3]), {"a": 1, "b": 1})
    r2 = rr.Factor(relation([[1.0, -0.7], [-0.7, 2.5]], [0.2, 0.8]), {"b": 1, "c": 1})
    measurement = rr.CanonicalGaussian(
        jnp.array([H * Y / NOISE**2]), jnp.array([[H**2 / NOISE**2]])
    )
    return r1, r2, measurement


# --8<-- [end:factors]


# --8<-- [start:messages]
def mark(message: rr.CanonicalGaussian) -> rr.AbstractChannel:
    """The query's evidence on a channel from its incoming message."""
    p = message.precision[0, 0]
    if float(p) == 0.0:
        return rr.Latent()
    return rr.Unobserved(message.info[0] / p, p)


def pass_messages(r1, r2, measurement, sweeps=10, tol=1e-13):
    """Flooding: every factor answers its incoming messages, until nothing moves."""
    flat = rr.CanonicalGaussian(jnp.zeros(1), jnp.zeros((1, 1)))
    to_factor = {("R1", "b"): flat, ("R2", "b"): flat, ("R2", "c"): measurement}
    out = {}
    history = []
    for _ in range(sweeps):
        new = {}
        for name, factor in (("R1", r1), ("R2", r2)):
            marks = {ch: mark(msg) for (f, ch), msg in to_factor.items() if f == name}
            sol = rr.factor_infer(factor, marks)
            for ch, msg in rr.factor_messages(factor, sol, marks).items():
                new[(name, ch)] = msg
        change = (
            max(
                float(jnp.max(jnp.abs(new[k].info - out[k].info)))
                + float(jnp.max(jnp.abs(new[k].precision - out[k].precision)))
                for k in new
            )
            if out
            else np.inf
        )
        out = new
        history.append(change)
        # the variable-to-factor messages: the product of the others' messages
        to_factor = {
            ("R1", "b"): out[("R2", "b")],
            ("R2", "b"): out[("R1", "b")],
            ("R2", "c"): measurement,
        }
        if change <= tol:
            break
    beliefs = {
        "a": out[("R1", "a")].moment(),
        "b": rr.combine(out[("R1", "b")], out[("R2", "b")]).moment(),
        "c": rr.combine(out[("R2", "c")], measurement).moment(),
    }
    return beliefs, history


# --8<-- [end:messages]


# --8<-- [start:joint]
def joint_solve(r1, r2):
    """The product of the relations with the measurement as a soft input on c."""
    joint = rr.ProductRelation(
        [
            rr.named_relation(r1, ["a", "b"], BLOCKS),
            rr.named_relation(r2, ["b", "c"], BLOCKS),
        ]
    )
    z0 = rr.assemble_state(BLOCKS, {"c": Y / H})
    rho = rr.assemble_state(BLOCKS, {"c": H / NOISE})
    sol = rr.implicit_infer(joint, z0, rho)
    return rr.laplace_belief(joint, sol, rho)


# --8<-- [end:joint]


# --8<-- [start:engine]
def engine(r1, r2):
    """The same graph for the engine: variables, relation factors and the
    measurement as a linear-Gaussian factor; solved jointly and by belief
    propagation."""
    graph = rr.FactorGraph(
        {"a": 1, "b": 1, "c": 1},
        [
            rr.RelationFactor(r1, {"a": "a", "b": "b"}),
            rr.RelationFactor(r2, {"b": "b", "c": "c"}),
            rr.GaussianFactor(["c"], [[H]], [Y], NOISE**-2),
        ],
    )
    sol = rr.solve_graph(graph)
    covariances = rr.graph_laplace(graph, sol)
    bp = rr.propagate_beliefs(graph)
    return sol, covariances, bp


# --8<-- [end:engine]


def main(smoke: bool = False) -> dict:
    del smoke  # the run is cheap: the smoke run is the run
    jax.config.update("jax_enable_x64", True)
    r1, r2, measurement = graph()
    beliefs, history = pass_messages(r1, r2, measurement)
    joint = joint_solve(r1, r2)
    print(f"messages converged in {len(history)} sweeps")
    print("variable   mean (messages)   mean (joint)   sd (messages)   sd (joint)")
    err = 0.0
    for i, v in enumerate(BLOCKS):
        m, s = float(beliefs[v].mean[0]), float(jnp.sqrt(beliefs[v].cov[0, 0]))
        mj, sj = float(joint.mean[i]), float(jnp.sqrt(joint.cov[i, i]))
        err = max(err, abs(m - mj), abs(s - sj))
        print(f"{v:>8}   {m:15.10f}   {mj:12.10f}   {s:13.10f}   {sj:10.10f}")
    print(f"max |messages - joint| = {err:.1e}")
    sol, covariances, bp = engine(r1, r2)
    engine_err = 0.0
    for i, v in enumerate(BLOCKS):
        sj = float(jnp.sqrt(joint.cov[i, i]))
        engine_err = max(
            engine_err,
            abs(float(sol.value[v][0]) - float(joint.mean[i])),
            abs(float(bp.value[v][0]) - float(joint.mean[i])),
            abs(float(jnp.sqrt(covariances[v][0, 0])) - sj),
            abs(float(jnp.sqrt(bp.covariances[v][0, 0])) - sj),
        )
    print(
        f"engine: solve_graph in {int(sol.stats['num_steps'])} Newton steps, "
        f"propagate_beliefs in {int(bp.stats['num_steps'])} iterations; "
        f"max |engine - joint| = {engine_err:.1e}"
    )
    return {
        "error": err,
        "engine_error": engine_err,
        "sweeps": len(history),
        "beliefs": beliefs,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    main(smoke=parser.parse_args().smoke)
