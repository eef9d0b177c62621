"""Several processes on `jax.distributed`: `batch_mesh`, `shard_batch`,
`process_share` and `fit(..., mesh=)`.

The multi-process tests start two processes on 127.0.0.1 (a free port, CPU
collectives through gloo) and kill them after a timeout, so that a hung peer
fails the test rather than the run. The results are compared with the same
computations in a single process, in float64.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import retrax
from helpers import tree_allclose, unchecked
from retrax import diffusion as rd


ROOT = pathlib.Path(__file__).parents[2]


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)  # one CPU device per process
    # compile as this session does (the x64 sessions turn optimisations off)
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = str(
        jax.config.read("jax_disable_most_optimizations")
    )
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_group(commands: list[list[str]], timeout: float, log: pathlib.Path):
    """Run the commands at once, each in its own process group; kill them all
    when one fails or the timeout passes. Returns the exit codes."""
    procs = []
    with open(log, "w") as f:
        for command in commands:
            procs.append(
                subprocess.Popen(
                    command,
                    env=_env(),
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + timeout
        try:
            while any(p.poll() is None for p in procs):
                failed = any(p.returncode not in (None, 0) for p in procs)
                if failed or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
    codes = [p.returncode for p in procs]
    timed_out = time.monotonic() > deadline
    assert codes == [0] * len(procs), (
        f"exit codes {codes}{' (timed out)' if timed_out else ''}:\n"
        + log.read_text()[-4000:]
    )


# ---- one process: the helpers are the identity on one device ----


def test_one_process_shard_batch_and_share():
    x = np.arange(12.0).reshape(4, 3)
    tree = {"x": x, "t": np.arange(4)}
    share = retrax.process_share(tree)
    assert np.array_equal(share["x"], x) and np.array_equal(share["t"], tree["t"])
    mesh = retrax.batch_mesh()
    assert mesh.axis_names == ("batch",) and mesh.size == jax.device_count()
    assert mesh.axis_types == (jax.sharding.AxisType.Auto,)
    out = retrax.shard_batch(tree, mesh)
    assert isinstance(out["x"], jax.Array) and out["x"].sharding.mesh == mesh
    assert np.array_equal(np.asarray(out["x"]), x)
    assert out["t"].dtype == jnp.asarray(tree["t"]).dtype
    # the default mesh
    assert np.array_equal(np.asarray(retrax.shard_batch(x)), x)


def test_shard_batch_bad_input():
    with pytest.raises(ValueError, match="same number of rows"):
        retrax.shard_batch((np.zeros((4, 2)), np.zeros((3, 2))))
    with pytest.raises(ValueError, match="leading batch axis"):
        retrax.shard_batch(np.float64(1.0))
    with pytest.raises(ValueError, match="holds no arrays"):
        retrax.shard_batch({})
    with pytest.raises(TypeError, match="`mesh` must be a jax.sharding.Mesh"):
        unchecked(retrax.shard_batch)(np.zeros((2, 2)), mesh="batch")
    with pytest.raises(TypeError, match="must hold arrays"):
        unchecked(retrax.process_share)(["rows"])
    with pytest.raises(TypeError, match="`axis_name` must be a string"):
        unchecked(retrax.batch_mesh)(0)


def _fit_with_and_without_mesh(getkey, rtol):
    data = jax.random.normal(getkey(), (32, 2))
    model = rd.TimeMLP(2, hidden=8, depth=1, key=getkey())
    pred = rd.NoisePredictor(model, rd.VPSDE())
    key = getkey()
    kw = dict(steps=3, batch_size=8, progress=False, optimizer=optax.adam(1e-2))
    run = rd.fit(pred, data, key, **kw)
    plain, losses = run.value, run.losses
    run = rd.fit(pred, data, key, mesh=retrax.batch_mesh(), **kw)
    meshed, meshed_losses = run.value, run.losses
    arrays = lambda m: eqx.filter(m, eqx.is_array)
    assert tree_allclose(arrays(meshed), arrays(plain), rtol=rtol)
    assert tree_allclose(meshed_losses, losses, rtol=rtol)
    return pred, data, key, kw


@pytest.mark.full
def test_fit_on_a_one_process_mesh_equals_fit(getkey):
    pred, data, key, kw = _fit_with_and_without_mesh(getkey, rtol=1e-12)
    with pytest.raises(TypeError, match="`mesh` must be a jax.sharding.Mesh"):
        unchecked(rd.fit)(pred, data, key, mesh=("batch",), **kw)


@pytest.mark.float32
def test_fit_on_a_one_process_mesh_equals_fit_float32(getkey):
    _fit_with_and_without_mesh(getkey, rtol=1e-6)


# ---- two processes ----


@pytest.mark.slow
def test_two_processes_filter_and_bad_input(tmp_path):
    """Cheap: a small filtered batch, and each bad input raises on every process."""
    coordinator = f"127.0.0.1:{_free_port()}"
    worker = str(ROOT / "tests" / "distributed_worker.py")
    out = tmp_path / "result"
    commands = [
        [sys.executable, worker, coordinator, "2", str(rank), str(out)]
        for rank in range(2)
    ]
    _run_group(commands, timeout=150, log=tmp_path / "log.txt")
    results = [json.loads(pathlib.Path(f"{out}.{rank}").read_text()) for rank in (0, 1)]
    for rank, result in enumerate(results):
        assert (result["rank"], result["count"]) == (rank, 2)
        # each process holds and filters two of the four signals
        assert result["rows_here"] == [2]
        assert result["filter_error"] <= 1e-12
        assert "`batch` has 3 rows" in result["indivisible"]
        assert "over 2 processes" in result["indivisible"]
        assert "`local_batch` differs across processes" in result["mismatch"]
        assert "process 0 holds [['batch', [2, 16]" in result["mismatch"]
        assert "process 1 holds [['batch', [1, 16]" in result["mismatch"]
        assert (
            "`batch_size` (3) must be a multiple of the 2 devices"
            in (result["batch_size"])
        )
        assert "on 2 processes" in result["batch_size"]
        assert "`data` differs across processes" in result["data"]
        assert (
            "`checkpoint_dir` is not supported with a `mesh` that spans"
            in (result["checkpoint"])
        )


@pytest.mark.slow
def test_multiprocess_example_matches_one_process(tmp_path):
    """The launcher example, spawning its two processes itself (smoke sizes):
    filtering, training and relation queries equal one process's."""
    out = tmp_path / "result.json"
    script = str(ROOT / "examples" / "multiprocess.py")
    command = [sys.executable, script, "--spawn", "2", "--smoke", "--timeout", "400"]
    _run_group([[*command, "--out", str(out)]], timeout=420, log=tmp_path / "log.txt")
    result = json.loads(out.read_text())
    assert (result["processes"], result["devices"]) == (2, 2)
    assert result["filter_rows_here"] == [4]  # 8 signals, 4 on each process
    # filtering (outputs, gradients with respect to the signals and the effect
    # chain) and queries (answers, gradients with respect to the queries and
    # the relation) to 1e-12; the parameters after 3 data-parallel steps of
    # `fit` and of the optax loop equal one process's on the combined batch
    assert set(result["errors"]) == {
        "filter",
        "filter_chain",
        "fit",
        "chain",
        "queries",
        "query_relation",
    }
    for name, err in result["errors"].items():
        assert err <= 1e-12, (name, err)
    # the replicated parameters are bit-for-bit the same on both processes
    assert result["param_spread"] == 0.0
    assert len(result["fit_losses"]) == 3


@pytest.mark.loud
@pytest.mark.slow
def test_two_processes_that_disagree_raise_on_both(tmp_path):
    """Each argument that differs between the two processes raises the same
    error on both, naming it and what each holds, instead of hanging one in a
    collective or training parameters that are not replicated."""
    coordinator = f"127.0.0.1:{_free_port()}"
    worker = str(ROOT / "tests" / "distributed_agreement_worker.py")
    out = tmp_path / "result"
    commands = [
        [sys.executable, worker, coordinator, "2", str(rank), str(out)]
        for rank in range(2)
    ]
    _run_group(commands, timeout=300, log=tmp_path / "log.txt")
    results = [json.loads(pathlib.Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    want = {
        "steps": ("steps=2", "steps=3"),
        "batch_size": ("batch_size=4", "batch_size=3"),
        "chunk_size": ("chunk_size=1", "chunk_size=2"),
        "t_range": ("t_range[1]=0.2", "t_range[1]=0.30000000000000004"),
        "ema": ("ema=None", "ema=0.9"),
        "key": ("key=key ", "key=key "),
        "pred": ("pred.model", "pred.model"),
        "optimizer": ("step_size=-0.001", "step_size=-0.002"),
        "schedule": ("[10]=1.0", "[10]=2.0"),
        "injected": ("learning_rate']=0.1", "learning_rate']=1.1"),
        "data": ("sha256:", "sha256:"),
    }
    names = {"schedule": "optimizer", "injected": "optimizer"}
    for result in results:
        for case, (zero, one) in want.items():
            message = result[case]
            assert message is not None, case
            name = names.get(case, case)
            assert message.startswith(f"`{name}` differs across processes"), message
            assert f"process 0 holds {name}" in message, message
            assert zero in message.split("; process 1")[0], (case, message)
            assert one in message.split("; process 1")[1], (case, message)
    # both processes give the same message, and then train together
    assert {k: v for k, v in results[0].items() if k != "rank"} == {
        k: v for k, v in results[1].items() if k != "rank"
    }
    assert len(results[0]["losses"]) == 2
    assert len(results[0]["continued"]) == 2
    message = results[0]["opt_state"]
    assert message.startswith("`opt_state` differs across processes"), message
    assert "opt_state.step=2; process 1 holds opt_state.step=3" in message
