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

import pytest


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


ROOT = pathlib.Path(__file__).parents[2]


def run_on_8_devices(
    script: pathlib.Path,
    timeout: int,
    devices: int = 8,
    env: dict | None = None,
    optimise: bool = True,
) -> dict:
    """Run `script` on 8 (or `devices`) simulated CPU devices, with `env` added
    to the environment; the JSON of its `RESULT` line.

    The script compiles with this session's XLA flags (conftest.py: the CPU
    fusion emitters off, which changes only how fusions are emitted, not the
    optimised HLO). With `optimise=False` it also skips most of XLA's
    optimisation passes where this session does: for scripts that compare
    values, not the compiled programs' collectives, that halves their time.
    """
    import jax

    env = {**os.environ, **(env or {})}
    env["XLA_FLAGS"] = " ".join(
        [
            env.get("XLA_FLAGS", ""),
            f"--xla_force_host_platform_device_count={devices}",
        ]
    ).strip()
    if not optimise:
        env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = str(
            jax.config.read("jax_disable_most_optimizations")
        )
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0].removeprefix("RESULT "))


@pytest.mark.slow
def test_sharded_filtering_queries_and_training_match_one_device():
    # Values and placements only: compiled without most optimisations.
    result = run_on_8_devices(
        ROOT / "examples" / "sharding.py", timeout=300, optimise=False
    )
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


BALLISTICS_ON_4_DEVICES = """
import json
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from retrax.ops import ballistics

jax.config.update("jax_enable_x64", True)
rng = np.random.default_rng(0)
x = np.abs(rng.normal(size=(8, 32)))
per_signal = (x, rng.uniform(0.1, 0.5, 8), rng.uniform(0.01, 0.1, 8))
per_sample = (x, rng.uniform(0.1, 0.5, (8, 32)), rng.uniform(0.01, 0.1, (8, 32)))
f = jax.jit(jax.vmap(ballistics))
g = jax.jit(jax.grad(lambda *a: jnp.sum(jax.vmap(ballistics)(*a) ** 2), (0, 1, 2)))
out = {}
for kind in ("Auto", "Explicit"):
    mesh = jax.make_mesh((4,), ("batch",), axis_types=(getattr(AxisType, kind),))
    for name, args in (("per signal", per_signal), ("per sample", per_sample)):
        ref = np.asarray(f(*args))
        with jax.set_mesh(mesh):
            put = jax.device_put(args, NamedSharding(mesh, P("batch")))
            y = f(*put)
            programs = [h.lower(*put).compile().as_text() for h in (f, g)]
        out[kind + " " + name] = {
            "equal": bool(np.array_equal(np.asarray(y), ref)),
            "split": len({s.device for s in y.addressable_shards}) == 4
            and y.addressable_shards[0].data.shape[0] == 2,
            "all_gathers": sum(p.count("all-gather") for p in programs),
        }
print("RESULT " + json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("kernels", ["on", "off"])
def test_sharded_ballistics_stays_split(tmp_path, kernels):
    # The compiled kernel runs on each device's signals (`custom_partitioning`):
    # a batch split over the devices stays split, with no all-gather in the
    # forward or gradient program, on automatic and explicit mesh axes; the
    # pure-JAX loop (kernels off) alike.
    script = tmp_path / "ballistics_on_4_devices.py"
    script.write_text(BALLISTICS_ON_4_DEVICES)
    env = {"RETRAX_DISABLE_KERNELS": "1" if kernels == "off" else "0"}
    result = run_on_8_devices(script, timeout=300, devices=4, env=env)
    assert len(result) == 4
    for name, case in result.items():
        assert case == {"equal": True, "split": True, "all_gathers": 0}, name


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
        return y + jax.vmap(lambda s: linear_recurrence(s, decay=0.9))(x)

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
    from retrax.ops._ballistics_primitive import switched_loop as _switched_loop

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


@pytest.mark.full
def test_checked_ops_inside_shard_map_on_one_device():
    # The input checks (`eqx.error_if`) joined a value that varies over the
    # mesh with an invariant callback result, which `shard_map` rejects:
    # per-signal coefficients, the SVF module and the gradient all failed.
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from helpers import assert_close
    from retrax.filters import SVF
    from retrax.ops import lfilter

    mesh = jax.make_mesh((1,), ("batch",))
    rng = np.random.default_rng(0)
    b = rng.uniform(-1, 1, (2, 3))
    a = np.stack([[1.0, -0.5, 0.2], [1.0, 0.3, -0.1]])
    x = rng.standard_normal((2, 16))

    def put(v):
        return jax.device_put(jnp.asarray(v), NamedSharding(mesh, P("batch")))

    def sharded(f):
        return jax.jit(
            jax.shard_map(f, mesh=mesh, in_specs=P("batch"), out_specs=P("batch"))
        )

    filt = jax.vmap(lambda b, a, x: lfilter(b, a, x))
    assert_close(sharded(filt)(put(b), put(a), put(x)), filt(b, a, x))
    module = jax.vmap(SVF(1000.0, 0.9))
    assert_close(sharded(module)(put(x)), module(jnp.asarray(x)))

    def loss(f, b, a, x):
        return jnp.sum(f(b, a, x) ** 2)

    grads = jax.grad(loss, argnums=(1, 2, 3))(sharded(filt), put(b), put(a), put(x))
    want = jax.grad(loss, argnums=(1, 2, 3))(filt, b, a, x)
    for got, ref in zip(grads, want, strict=True):
        assert_close(got, ref)
    # The checks still hold there, with their messages.
    a[1, 1] = np.nan
    with pytest.raises(Exception, match="`a` has non-finite"):
        jax.block_until_ready(sharded(filt)(put(b), put(a), put(x)))


@pytest.mark.slow
def test_every_op_and_module_sharded_matches_one_device():
    # `tests/sharded_ops.py`: every public op and module of ops, dynamics and
    # filters, values and gradients, on a batch split over 8 devices, by
    # `jit` with `NamedSharding` inputs and inside `shard_map`.
    result = run_on_8_devices(ROOT / "tests" / "sharded_ops.py", timeout=1800)
    assert result["devices"] == 8
    assert result["failures"] == {}
    cases = result["cases"]
    assert len(cases) == 31
    for name, case in cases.items():
        assert case["auto_error"] <= 1e-12, name
        assert case["shard_map_error"] <= 1e-12, name
        # Outputs stay split over the batch, and nothing gathers the batch
        # onto every device (the ballistics kernel used to).
        assert case["outputs_split"], name
        assert case["all_gathers"] == 0, name
    # The docs' recipe (`jax.make_mesh`, `jax.set_mesh`) for a module built on
    # the compiled kernel and for a filter.
    for name, case in result["explicit"].items():
        assert case["error"] <= 1e-12, name
        assert case["split"], name
    # The ops that check their coefficients do so in the sharded program.
    checked = ["ballistics", "fir", "lfilter", "sosfilt", "filtfilt", "svf"]
    checked += ["state_space", "diag_state_space", "compexp_gain", "limiter_gain"]
    checked += ["Compressor", "SVF", "ParametricEQ"]
    for name in checked:
        assert cases[name]["checks"] > 0, name
    # A bad coefficient of one example raises the op's message.
    assert result["bad_inputs"] == {
        "lfilter a": "`a`",
        "ballistics at": "`at`",
        "svf cutoff": "`cutoff`",
    }


def test_signal_checks_go_through_the_shard_map_safe_error_if():
    # `eqx.error_if` on a value that differs per device fails inside
    # `shard_map` (see `retrax._errors.error_if`); the signal-processing
    # packages use the wrapper for every run-time check.
    src = ROOT / "src" / "retrax"
    direct = [
        f"{path.relative_to(src)}:{number}"
        for package in ("ops", "dynamics", "filters", "synth")
        for path in sorted((src / package).glob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "eqx.error_if(" in line or "equinox.error_if(" in line
    ]
    assert direct == [], "use retrax._errors.error_if instead"
