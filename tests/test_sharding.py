"""Sharding recipes: filtering, relation queries and training on a device mesh.

The recipes (`examples/sharding.py`) run in a subprocess on 8 simulated CPU
devices, since the device count is fixed when JAX starts. The script enables
float64 itself; every sharded result must equal the one-device run to 1e-12.
"""

import json
import os
import pathlib
import subprocess
import sys


ROOT = pathlib.Path(__file__).parent.parent


def test_sharded_filtering_queries_and_training_match_one_device():
    env = dict(os.environ)
    env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "sharding.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout
    result = json.loads(lines[0].removeprefix("RESULT "))
    assert result["devices"] == 8
    assert result["x64"]
    # The filtered batch really is spread over all eight devices.
    assert result["filter_devices"] == 8
    assert result["filter_error"] <= 1e-12
    assert result["associative_error"] <= 1e-10
    # Relation queries split over the devices equal the one-device answers.
    assert result["query_devices"] == 8
    assert result["query_error"] <= 1e-12
    # Three optimiser steps: automatic (jit + NamedSharding) and explicit
    # (shard_map + pmean) data parallelism both equal the one-device run.
    assert set(result["train_errors"]) == {"jit + NamedSharding", "shard_map + pmean"}
    for err in result["train_errors"].values():
        assert err <= 1e-12
    losses = list(result["losses"].values())
    assert max(losses) - min(losses) <= 1e-12 * max(losses)


def test_filters_inside_shard_map_on_one_device():
    # Inside `shard_map` a scan's carry must vary over the same mesh axes as
    # the signal; the zero initial state the ops create must be marked so.
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P

    from helpers import assert_close, naive_allpole
    from retrax.ops import allpole, linear_recurrence

    mesh = jax.make_mesh((1,), ("batch",))
    x = jax.device_put(
        jnp.linspace(-1.0, 1.0, 64).reshape(2, 32), NamedSharding(mesh, P("batch"))
    )
    a = jnp.asarray([-0.5, 0.2])

    def local(x):
        y = jax.vmap(lambda s: allpole(s, a))(x)
        return y + jax.vmap(lambda s: linear_recurrence(0.9, s))(x)

    for method in ("sequential", "associative"):
        fn = jax.shard_map(
            lambda x, m=method: jax.vmap(lambda s: allpole(s, a, method=m))(x),
            mesh=mesh,
            in_specs=P("batch"),
            out_specs=P("batch"),
        )
        assert_close(jax.jit(fn)(x)[1], naive_allpole(x[1], a))
    both = jax.shard_map(local, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"))
    grad = jax.grad(lambda x: jnp.sum(jax.jit(both)(x) ** 2))(x)
    assert bool(jnp.all(jnp.isfinite(grad)))


def test_ballistics_inside_shard_map_on_one_device():
    # The compiled kernel's operands and result, and the fallback scan's zero
    # initial state, must vary over the mesh axes like the signal.
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from helpers import assert_close
    from retrax.ops import ballistics
    from retrax.ops._ballistics import _switched_loop

    mesh = jax.make_mesh((1,), ("batch",))
    signal = np.abs(np.sin(np.linspace(0.0, 20.0, 64))).reshape(2, 32)
    x = jax.device_put(jnp.asarray(signal), NamedSharding(mesh, P("batch")))
    local = jax.vmap(lambda s: ballistics(s, 0.3, 0.05))
    fn = jax.shard_map(local, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"))
    zero = jnp.zeros((), x.dtype)
    ref = _switched_loop(jnp.asarray(signal[1]), zero + 0.3, zero + 0.05, zero)
    assert_close(jax.jit(fn)(x)[1], ref)
    loop = jax.vmap(lambda s: _switched_loop(s, zero + 0.3, zero + 0.05, zero))
    looped = jax.shard_map(loop, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"))
    assert_close(jax.jit(looped)(x)[1], ref)
    grad = jax.grad(lambda x: jnp.sum(jax.jit(fn)(x) ** 2))(x)
    assert bool(jnp.all(jnp.isfinite(grad)))
