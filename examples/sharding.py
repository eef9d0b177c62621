"""Filter a batch of signals, answer a batch of relation queries, and train
data-parallel over a device mesh.

Three recipes on a `jax.sharding.Mesh` with one axis, `"batch"`:

1. filtering: the signals (and their per-signal coefficients) are split across
   the devices along the batch axis with a `NamedSharding`; `jax.jit` of the
   vmapped filter then runs each device's share where it lives;
2. a data-parallel training step: an all-pole model (reflection coefficients,
   an `eqx.Module`) is replicated on every device, the batch is sharded, and
   one optax step averages the gradients across devices. `jax.jit` inserts the
   cross-device sum itself; a second version writes it out with `shard_map`
   and `lax.pmean`;
3. relation queries: many "x is clamped, what is y?" queries of a diffusion
   relation (`implicit_infer`) are split across the devices, the relation
   itself replicated.

Each result is compared with the same computation on one device.

Without accelerators, run it on 8 simulated CPU devices:
`XLA_FLAGS=--xla_force_host_platform_device_count=8 python examples/sharding.py`
(the script sets that flag itself when it is unset).
"""

import os


os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import json  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from retrax import diffusion as rd, relations as rr  # noqa: E402
from retrax.filters import rc2lpc  # noqa: E402
from retrax.ops import allpole  # noqa: E402


# The comparisons with one device are to 1e-12: float64 throughout.
jax.config.update("jax_enable_x64", True)


class AllPoleModel(eqx.Module):
    """An all-pole filter kept stable by `tanh` reflection coefficients."""

    theta: jax.Array

    def __call__(self, x):
        return allpole(x, rc2lpc(jnp.tanh(self.theta)))


def make_data(batch, length, order=4, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((batch, length)))
    # Per-signal coefficients for the filtering recipe: swept resonances.
    theta = np.linspace(0.2, 2.0, length)[None, :] + rng.uniform(0, 0.5, (batch, 1))
    a_sweep = jnp.asarray(
        np.stack([-1.8 * np.cos(theta), np.full_like(theta, 0.81)], -1)
    )
    # One target filter for the training recipe.
    true = AllPoleModel(jnp.arctanh(jnp.asarray([0.6, -0.5, 0.4, -0.3])[:order]))
    y = jax.vmap(true)(x)
    return x, a_sweep, y


# --8<-- [start:filter]
def filter_sharded(mesh, x, a, method="sequential"):
    """`allpole` on a batch split across the mesh's devices."""
    batch = NamedSharding(mesh, P("batch"))  # split axis 0 across devices
    x, a = jax.device_put((x, a), batch)
    y = jax.jit(jax.vmap(lambda x, a: allpole(x, a, method=method)))(x, a)
    return y  # sharded like x: each device holds its own signals


# --8<-- [end:filter]


# --8<-- [start:train]
optimiser = optax.adam(1e-2)


def loss_fn(model, x, y):
    return jnp.mean((jax.vmap(model)(x) - y) ** 2)


@eqx.filter_jit
def train_step(model, opt_state, x, y):
    loss, grads = eqx.filter_value_and_grad(loss_fn)(model, x, y)
    updates, opt_state = optimiser.update(grads, opt_state, model)
    return eqx.apply_updates(model, updates), opt_state, loss


def train_step_sharded(mesh, model, opt_state, x, y):
    """Parameters replicated, data sharded: plain `jit` does the rest."""
    replicated = NamedSharding(mesh, P())
    batch = NamedSharding(mesh, P("batch"))
    model, opt_state = jax.device_put((model, opt_state), replicated)
    x, y = jax.device_put((x, y), batch)
    return train_step(model, opt_state, x, y)


# --8<-- [end:train]


# --8<-- [start:shard_map]
def train_step_shard_map(mesh, model, opt_state, x, y):
    """The same step with the cross-device mean written out."""

    def global_loss(model, x, y):
        # Each device sees its own rows of x and y. The batch mean is the mean
        # over devices of the per-device means (equal shares). Differentiate
        # this global loss: the model enters every device unchanged, so the
        # gradient's transpose sums the devices' contributions itself. (Taking
        # `pmean` of per-device gradients instead would count them n times.)
        return jax.lax.pmean(loss_fn(model, x, y), "batch")

    def local_grads(model, x, y):
        return eqx.filter_value_and_grad(global_loss)(model, x, y)

    model = jax.device_put(model, NamedSharding(mesh, P()))
    x, y = jax.device_put((x, y), NamedSharding(mesh, P("batch")))
    sharded = jax.shard_map(
        local_grads,
        mesh=mesh,
        in_specs=(P(), P("batch"), P("batch")),
        out_specs=P(),
    )
    loss, grads = jax.jit(sharded)(model, x, y)
    updates, opt_state = optimiser.update(grads, opt_state, model)
    return eqx.apply_updates(model, updates), opt_state, loss


# --8<-- [end:shard_map]


# --8<-- [start:queries]
def ring_relation():
    """A closed-form relation: 48 Gaussians on the unit circle, 128 nodes."""
    angles = jnp.linspace(0, 2 * jnp.pi, 48, endpoint=False)
    ring = jnp.stack([jnp.cos(angles), jnp.sin(angles)], -1)
    pred = rd.GaussianMixtureEps(rd.VPSDE(), ring, jnp.full(48, 0.05))
    return rr.ImplicitDiffusion(pred, rr.field_nodes(jax.random.key(0), 2, samples=8))


def answer_queries(relation, z0):
    """Clamp x, solve for y, for every query (row of `z0`) at once."""
    rho = jnp.array([jnp.inf, 0.0])
    solve = jax.vmap(lambda q: rr.implicit_infer(relation, q, rho, tol=1e-12).value)
    return eqx.filter_jit(solve)(z0)


def queries_sharded(relation, z0):
    """The queries split across the devices; the relation is replicated.

    The mesh axis is `Auto`: jit propagates the queries' sharding through the
    solver, whose loops and conditionals trace with unsharded types.
    """
    auto = jax.make_mesh(
        (len(jax.devices()),), ("batch",), axis_types=(jax.sharding.AxisType.Auto,)
    )
    z0 = jax.device_put(z0, NamedSharding(auto, P("batch")))
    return answer_queries(relation, z0)


# --8<-- [end:queries]


def relative_error(a, b):
    # Gathered to the host: the two sides live on different devices.
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    return max(
        float(np.max(np.abs(np.asarray(u) - np.asarray(v))) / np.max(np.abs(v)))
        for u, v in zip(leaves_a, leaves_b, strict=True)
    )


def main(batch: int = 32, length: int = 2048) -> dict:
    devices = jax.devices()
    mesh = jax.make_mesh((len(devices),), ("batch",))
    print(f"{len(devices)} devices: {mesh}")
    if batch % len(devices):
        raise ValueError(f"batch {batch} must divide over {len(devices)} devices")
    x, a_sweep, y_target = make_data(batch, length)

    # Filtering: sharded against one device.
    with jax.set_mesh(mesh):
        y_sharded = filter_sharded(mesh, x, a_sweep)
        y_associative = filter_sharded(mesh, x, a_sweep, "associative")
    one = jax.devices()[0]
    y_single = jax.jit(jax.vmap(allpole))(*jax.device_put((x, a_sweep), one))
    shards = {s.device for s in y_sharded.addressable_shards}
    filter_error = relative_error(y_sharded, y_single)
    print(f"filter: output on {len(shards)} devices, {y_sharded.sharding.spec}")
    print(f"filter: max |sharded - one device| / max |y| = {filter_error:.2e}")
    associative_error = relative_error(y_associative, y_single)
    print(f"filter: associative method, sharded: {associative_error:.2e}")

    # Relation queries: sharded against one device.
    relation = ring_relation()
    xs = jnp.linspace(-0.9, 0.9, batch)
    starts = jnp.where(jnp.arange(batch) % 2 == 0, 0.5, -0.5)
    z0 = jnp.stack([xs, starts], -1)
    z_single = answer_queries(relation, jax.device_put(z0, one))
    z_sharded = queries_sharded(relation, z0)
    query_devices = len({s.device for s in z_sharded.addressable_shards})
    query_error = relative_error(z_sharded, z_single)
    print(f"queries: {batch} answers on {query_devices} devices")
    print(f"queries: max |sharded - one device| / max |z| = {query_error:.2e}")

    # Training: three steps each way, from the same start.
    model = AllPoleModel(jnp.zeros(4))
    opt_state = optimiser.init(eqx.filter(model, eqx.is_array))
    runs = {}
    for name, step in (
        ("one device", None),
        ("jit + NamedSharding", train_step_sharded),
        ("shard_map + pmean", train_step_shard_map),
    ):
        m, s = model, opt_state
        for _ in range(3):
            if step is None:
                m, s, loss = train_step(m, s, *jax.device_put((x, y_target), one))
            else:
                with jax.set_mesh(mesh):
                    m, s, loss = step(mesh, m, s, x, y_target)
        runs[name] = (m, float(loss))
        print(f"train [{name}]: loss {float(loss):.10f}, theta {np.asarray(m.theta)}")
    train_errors = {
        name: relative_error(runs[name][0], runs["one device"][0])
        for name in runs
        if name != "one device"
    }
    for name, err in train_errors.items():
        print(f"train: max |{name} - one device| / max |theta| = {err:.2e}")
    result = {
        "devices": len(devices),
        "x64": bool(jax.config.jax_enable_x64),
        "filter_devices": len(shards),
        "filter_error": filter_error,
        "associative_error": associative_error,
        "query_devices": query_devices,
        "query_error": query_error,
        "train_errors": train_errors,
        "losses": {name: loss for name, (_, loss) in runs.items()},
    }
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
