"""Continuing and checkpointing `fit`, and the checkpoint files themselves.

Resumed runs are compared bit-for-bit (`np.array_equal`) with uninterrupted
ones: the steps draw their randomness by absolute step index and the chunks
of a resumed run are the same compiled program, so nothing may differ.
"""

import os
import pathlib
import runpy
import signal
import subprocess
import sys
import textwrap
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import retrax
import retrax.diffusion as rd
from helpers import fit_kwargs, tiny_training_problem, tree_is_finite
from retrax.diffusion import _train


ROOT = pathlib.Path(__file__).parents[2]

# The training problem, as a script: the fault test runs it in a subprocess
# (killed, then restarted), and the in-process tests load its definitions.
SCRIPT = textwrap.dedent(
    """
    import pathlib
    import sys
    import time

    import jax

    jax.config.update("jax_enable_x64", True)

    import equinox as eqx
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.experimental import io_callback

    import retrax.diffusion as rd

    # a checkpoint at the end of every chunk: steps 3, 6 and 8
    FIT = dict(steps=8, batch_size=8, chunk_size=3, progress=False)


    def problem():
        data = jax.random.normal(jax.random.key(0), (64, 2))
        model = rd.TimeMLP(2, hidden=8, depth=1, key=jax.random.key(1))
        return rd.NoisePredictor(model, rd.VPSDE()), data, jax.random.key(2)


    def calling(optimizer, action):
        # `optimizer` that calls `action(count)` on the host before each update
        def init(params):
            return optimizer.init(params), jnp.zeros((), jnp.int32)

        def update(grads, state, params=None):
            inner, count = state
            io_callback(action, None, count, ordered=True)
            updates, inner = optimizer.update(grads, inner, params)
            return updates, (inner, count + 1)

        return optax.GradientTransformation(init, update)


    def never(count):
        pass


    if __name__ == "__main__":
        directory, stop_at, signal_file, out = sys.argv[1:]

        def pause(count):
            # tell the test that training is between checkpoints, and wait to
            # be killed
            if int(count) == int(stop_at):
                pathlib.Path(signal_file).touch()
                time.sleep(600)

        pred, data, key = problem()
        run = rd.fit(
            pred,
            data,
            key,
            optimizer=calling(optax.adam(1e-2), pause),
            checkpoint_dir=directory,
            **FIT,
        )
        trained, losses = run.value, run.losses
        leaves = jax.tree.leaves(eqx.filter(trained, eqx.is_inexact_array))
        np.savez(out, losses, *leaves)
    """
)


class Script:
    """The script's problem, and one optimizer whose host hook can be swapped.

    One optimizer object for the module, so that its runs share one compiled
    chunk.
    """

    def __init__(self, path):
        self.path = path
        self.ns = runpy.run_path(str(path), run_name="train")
        self.action = self.ns["never"]
        self.optimizer = self.ns["calling"](optax.adam(1e-2), self._hook)

    def _hook(self, count):
        self.action(count)

    def fit(self, action=None, **kw):
        self.action = action or self.ns["never"]
        pred, data, key = self.ns["problem"]()
        return rd.fit(pred, data, key, optimizer=self.optimizer, **self.ns["FIT"], **kw)


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("script") / "train.py"
    path.write_text(SCRIPT)
    return Script(path)


@pytest.fixture(scope="module")
def reference(script):
    """The uninterrupted run of the script's problem."""
    run = script.fit()
    assert int(run.stats["resumed_from"]) == -1
    return run.value, run.losses


def params(pred):
    leaves = jax.tree.leaves(eqx.filter(pred, eqx.is_inexact_array))
    return [np.asarray(x) for x in leaves]


def assert_identical(a, b):
    a, b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, int | float):
            assert type(x) is type(y) and x == y
            continue
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        assert np.asarray(x).dtype == np.asarray(y).dtype
        assert np.array_equal(np.asarray(x), np.asarray(y))


def small_problem(getkey, hidden=8, dtype=jnp.float64):
    data = jax.random.normal(getkey(), (64, 2), dtype)
    model = rd.TimeMLP(2, hidden=hidden, depth=1, dtype=dtype, key=getkey())
    return rd.NoisePredictor(model, rd.VPSDE()), data, getkey()


# Most runs below share one compiled chunk: 4 steps of 8 examples, Adam 1e-3.
KW = dict(batch_size=8, progress=False, chunk_size=4)


def steps_in(directory):
    return sorted(int(p.stem.split("-")[1]) for p in directory.glob("checkpoint-*"))


def fit_run(*args, **kwargs):
    """`fit`'s predictor, losses and state, each run's whole answer."""
    run = rd.fit(*args, **kwargs)
    assert isinstance(run, rd.AbstractSolution)
    assert run.result == rd.RESULTS.successful
    assert int(run.stats["num_steps"]) == run.losses.shape[0]
    assert int(run.stats["num_skipped"]) == 0
    assert int(run.stats["nonfinite_step"]) == -1
    return run.value, run.losses, run.state


@pytest.mark.parametrize("ema", [None, 0.9])
def test_two_calls_end_where_one_call_ends(getkey, ema):
    pred, data, key = small_problem(getkey)
    kw = dict(KW, ema=ema)
    one, losses, state = fit_run(pred, data, key, steps=9, **kw)
    # the first call ends inside its second chunk
    first, l1, s1 = fit_run(pred, data, key, steps=5, **kw)
    assert s1.step == 5 and state.step == 9
    two, l2, s2 = fit_run(first, data, key, steps=4, opt_state=s1, **kw)
    assert_identical(params(two), params(one))
    assert_identical(jnp.concatenate([l1, l2]), losses)
    assert_identical(s2, state)
    assert (state.average is None) == (ema is None)
    # the state holds the last iterate; with `ema` the predictor holds the
    # average instead
    last_is_returned = [
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(state.params), params(one), strict=True)
    ]
    assert all(last_is_returned) if ema is None else not any(last_is_returned)
    # the deprecated spellings still give the same run, and say what replaces
    # them: `fit_solution`, `return_state=True` and `TrainSolution.pred`
    with pytest.warns(DeprecationWarning, match="`fit` takes the same arguments"):
        again = rd.fit_solution(pred, data, key, steps=9, **kw)
    with pytest.warns(DeprecationWarning, match=r"`\.state` is the state"):
        old = rd.fit(pred, data, key, steps=9, return_state=True, **kw)
    for run in (again, old):
        with pytest.warns(DeprecationWarning, match=r"use `\.value`"):
            assert_identical(params(run.pred), params(one))
        assert_identical((run.losses, run.state), (losses, state))


class Interrupt(Exception):
    pass


def crash_at_step_7(count):
    if int(count) == 7:
        raise Interrupt


def test_interrupted_run_resumes_bit_for_bit(tmp_path, script, reference):
    ref_pred, ref_losses = reference
    # a failure in the middle of the third chunk (steps 6 to 8)
    with pytest.raises(Exception, match="Interrupt"):
        script.fit(crash_at_step_7, checkpoint_dir=tmp_path)
    assert steps_in(tmp_path) == [3, 6]
    run = script.fit(checkpoint_dir=tmp_path)
    resumed, losses = run.value, run.losses
    assert int(run.stats["resumed_from"]) == 6
    assert int(run.stats["num_steps"]) == 8
    assert steps_in(tmp_path) == [3, 6, 8]
    assert_identical(params(resumed), params(ref_pred))
    assert_identical(losses, ref_losses)
    # a finished run found in its directory is returned without a step
    run = script.fit(crash_at_step_7, checkpoint_dir=tmp_path)
    done, done_losses = run.value, run.losses
    assert int(run.stats["resumed_from"]) == 8
    assert_identical(params(done), params(ref_pred))
    assert_identical(done_losses, ref_losses)


def test_resume_with_ema_bit_for_bit(getkey, tmp_path):
    pred, data, key = small_problem(getkey)
    kw = dict(KW, steps=9, ema=0.9)
    run = rd.fit(pred, data, key, **kw)
    ref_pred, ref_losses = run.value, run.losses
    rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)
    assert steps_in(tmp_path) == [4, 8, 9]
    # as if killed after the first checkpoint
    for step in (8, 9):
        (tmp_path / f"checkpoint-{step:09d}.ckpt").unlink()
    run = rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)
    resumed, losses = run.value, run.losses
    assert_identical(params(resumed), params(ref_pred))
    assert_identical(losses, ref_losses)


@pytest.mark.slow
def test_killed_subprocess_resumes_bit_for_bit(tmp_path, script, reference):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["JAX_PLATFORMS"] = "cpu"
    # bit-for-bit against this process's run: compile as this process does
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = str(
        int(jax.config.read("jax_disable_most_optimizations"))
    )
    directory, flag = tmp_path / "ckpt", tmp_path / "between-checkpoints"
    out, log = tmp_path / "out.npz", tmp_path / "log.txt"

    def command(stop_at):
        args = (script.path, directory, stop_at, flag, out)
        return [sys.executable, *map(str, args)]

    with open(log, "w") as f:
        proc = subprocess.Popen(command(7), env=env, stdout=f, stderr=f)
        deadline = time.monotonic() + 120
        while not flag.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                pytest.fail(f"the run never reached step 7:\n{log.read_text()}")
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    assert not out.exists()
    assert steps_in(directory) == [3, 6]

    restart = subprocess.run(
        command(-1), env=env, capture_output=True, text=True, timeout=120
    )
    assert restart.returncode == 0, restart.stderr
    assert steps_in(directory) == [3, 6, 8]
    ref_pred, ref_losses = reference
    with np.load(out) as saved:
        got = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    assert_identical(got, [ref_losses, *params(ref_pred)])


def test_checkpoint_every_longer_than_a_chunk(getkey, tmp_path):
    pred, data, key = small_problem(getkey)
    kw = dict(KW, steps=13)
    reference = rd.fit(pred, data, key, **kw).value
    trained = rd.fit(
        pred, data, key, checkpoint_dir=tmp_path, checkpoint_every=9, **kw
    ).value
    # chunk boundaries 4, 8, 12, 13: a checkpoint at the first one past 9,
    # and at the end
    assert steps_in(tmp_path) == [12, 13]
    assert_identical(params(trained), params(reference))
    # without `checkpoint_every`, one per chunk; the three newest are kept
    other = tmp_path / "every-chunk"
    rd.fit(pred, data, key, checkpoint_dir=other, **kw)
    assert steps_in(other) == [8, 12, 13]


def test_continue_a_run_with_checkpoints(getkey, tmp_path):
    # `opt_state` and `checkpoint_dir` together: the checkpoints of the
    # second call continue the first's step count
    pred, data, key = small_problem(getkey)
    reference = rd.fit(pred, data, key, steps=12, **KW).value
    first, _, state = fit_run(pred, data, key, steps=4, **KW)
    kw = dict(KW, steps=8, opt_state=state, checkpoint_dir=tmp_path)
    run = rd.fit(first, data, key, **kw)
    second, losses = run.value, run.losses
    assert steps_in(tmp_path) == [8, 12]
    assert losses.shape == (8,)
    assert_identical(params(second), params(reference))
    # resuming it needs the same `opt_state`
    (tmp_path / "checkpoint-000000012.ckpt").unlink()
    with pytest.raises(ValueError, match="continued an `opt_state` at step 4"):
        rd.fit(first, data, key, **dict(kw, opt_state=None))
    resumed = rd.fit(first, data, key, **kw).value
    assert_identical(params(resumed), params(reference))


@pytest.mark.full
def test_float32_model_resumes(getkey, tmp_path):
    pred, data, key = small_problem(getkey, dtype=jnp.float32)
    kw = dict(KW, steps=6)
    run = rd.fit(pred, data, key, **kw)
    reference, ref_losses = run.value, run.losses
    rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)
    for path in sorted(tmp_path.glob("checkpoint-*"))[1:]:
        path.unlink()
    run = rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)
    resumed, losses = run.value, run.losses
    assert losses.dtype == jnp.float32
    assert_identical(params(resumed), params(reference))
    assert_identical(losses, ref_losses)


def test_truncated_checkpoint_is_skipped(getkey, tmp_path):
    pred, data, key = small_problem(getkey)
    kw = dict(KW, steps=12)
    run = rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)
    reference, ref_losses = run.value, run.losses
    newest = tmp_path / "checkpoint-000000012.ckpt"
    whole = newest.read_bytes()
    # cut short, as by a write that stopped half way
    newest.write_bytes(whole[: len(whole) // 2])
    # a temporary file left by a killed writer is never read
    (tmp_path / ".checkpoint-000000013.abc.tmp").write_bytes(whole[:100])
    like = {"state": None, "losses": None}
    with pytest.warns(RuntimeWarning, match="checkpoint-000000012.ckpt"):
        with pytest.raises(ValueError, match="different structure"):
            retrax.load_checkpoint(tmp_path, like)
    with pytest.warns(RuntimeWarning, match="checkpoint-000000012.ckpt.*truncated"):
        run = rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)
        resumed, losses = run.value, run.losses
    assert_identical(params(resumed), params(reference))
    assert_identical(losses, ref_losses)
    # the resumed run rewrote it whole
    assert newest.read_bytes() == whole

    # one damaged byte is caught as well
    damaged = bytearray(whole)
    damaged[len(damaged) // 2] ^= 0x01
    newest.write_bytes(bytes(damaged))
    with pytest.warns(RuntimeWarning, match="checkpoint-000000012.ckpt.*SHA-256"):
        resumed = rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw).value
    assert_identical(params(resumed), params(reference))


def test_save_and_load_for_a_users_loop(tmp_path):
    params_ = {"w": jnp.arange(6.0).reshape(2, 3), "b": np.ones(3, np.float32)}
    opt = optax.adam(1e-3)
    tree = (params_, opt.init(params_), jax.random.key(7), 3, 0.5)
    assert retrax.load_checkpoint(tmp_path / "missing", tree) is None
    assert retrax.load_checkpoint(tmp_path, tree) is None
    for step in (10, 20, 30):
        path = retrax.save_checkpoint(
            tmp_path, step, tree, metadata={"lr": 1e-3, "step": step}, keep=2
        )
        assert path == tmp_path / f"checkpoint-{step:09d}.ckpt"
    assert steps_in(tmp_path) == [20, 30]
    found = retrax.load_checkpoint(tmp_path, tree)
    assert found.step == 30 and found.path == tmp_path / "checkpoint-000000030.ckpt"
    assert found.metadata == {"lr": 1e-3, "step": 30}
    assert_identical(found.tree, tree)
    assert isinstance(found.tree[3], int) and isinstance(found.tree[4], float)
    assert isinstance(found.tree[0]["b"], np.ndarray)
    # `jax.ShapeDtypeStruct` leaves describe the structure as well
    arrays = tree[:3]
    retrax.save_checkpoint(tmp_path / "arrays", 0, arrays)
    abstract = jax.eval_shape(lambda: arrays)
    assert_identical(retrax.load_checkpoint(tmp_path / "arrays", abstract).tree, arrays)


def test_corrupt_checkpoint_without_predecessor(getkey, tmp_path):
    pred, data, key = small_problem(getkey)
    kw = dict(KW, steps=4, checkpoint_dir=tmp_path)
    rd.fit(pred, data, key, **kw)
    (only,) = tmp_path.glob("checkpoint-*")
    only.write_bytes(only.read_bytes()[:-1])
    with pytest.warns(RuntimeWarning, match=only.name):
        with pytest.raises(ValueError, match="no intact checkpoint"):
            rd.fit(pred, data, key, **kw)
    only.write_bytes(b"not a checkpoint")
    with pytest.warns(RuntimeWarning, match="not a retrax checkpoint"):
        with pytest.raises(ValueError, match="no intact checkpoint"):
            retrax.load_checkpoint(tmp_path, {})


def test_checkpoint_of_another_run(getkey, tmp_path):
    pred, data, key = small_problem(getkey)
    kw = dict(KW, steps=4, checkpoint_dir=tmp_path)
    rd.fit(pred, data, key, **kw)
    wider, _, _ = small_problem(getkey, hidden=16)
    with pytest.raises(ValueError, match="different structure.*layers"):
        rd.fit(wider, data, key, **kw)
    with pytest.raises(ValueError, match="different structure"):
        rd.fit(pred, data, key, optimizer=optax.sgd(1e-3), **kw)
    with pytest.raises(ValueError, match="`batch_size` is 8 there and 4 here"):
        rd.fit(pred, data, key, **dict(kw, batch_size=4))
    with pytest.raises(ValueError, match="`steps` is 4 there and 5 here"):
        rd.fit(pred, data, key, **dict(kw, steps=5))
    with pytest.raises(ValueError, match="`ema` is None there and 0.5 here"):
        rd.fit(pred, data, key, ema=0.5, **kw)
    with pytest.raises(ValueError, match="other `data`"):
        rd.fit(pred, data + 1.0, key, **kw)
    with pytest.raises(ValueError, match="another `key`"):
        rd.fit(pred, data, getkey(), **kw)
    # a directory of a loop's own checkpoints
    other = tmp_path / "own"
    retrax.save_checkpoint(other, 4, {"state": None, "losses": jnp.zeros(4)})
    with pytest.raises(ValueError, match="not written by `fit`"):
        rd.fit(pred, data, key, **dict(kw, checkpoint_dir=other))


def test_fit_checkpoint_bad_input(getkey, tmp_path):
    pred, data, key = small_problem(getkey)
    kw = dict(KW, steps=4)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="`checkpoint_every` must be a positive"):
            rd.fit(pred, data, key, checkpoint_dir=tmp_path, checkpoint_every=bad, **kw)
    for bad in (2.5, True, "10"):
        with pytest.raises(TypeError, match="checkpoint_every"):
            rd.fit(pred, data, key, checkpoint_dir=tmp_path, checkpoint_every=bad, **kw)
    with pytest.raises(ValueError, match="`checkpoint_every` needs `checkpoint_dir`"):
        rd.fit(pred, data, key, checkpoint_every=2, **kw)
    with pytest.raises(TypeError, match="checkpoint_dir"):
        rd.fit(pred, data, key, checkpoint_dir=3, **kw)
    assert steps_in(tmp_path) == []


def test_continue_bad_input(getkey):
    pred, data, key = small_problem(getkey)
    kw = dict(KW, steps=4)
    _, _, state = fit_run(pred, data, key, **kw)
    with pytest.raises(TypeError, match="opt_state"):
        rd.fit(pred, data, key, opt_state=state.opt_state, **kw)
    with pytest.raises(ValueError, match="different optimiser"):
        rd.fit(pred, data, key, opt_state=state, optimizer=optax.sgd(1e-3), **kw)
    wider, _, _ = small_problem(getkey, hidden=16)
    with pytest.raises(ValueError, match="different predictor.*layers"):
        rd.fit(wider, data, key, opt_state=state, **kw)
    with pytest.raises(ValueError, match="`ema` is 0.5.*ema=None"):
        rd.fit(pred, data, key, opt_state=state, ema=0.5, **kw)
    with pytest.raises(ValueError, match="`key` differs from `opt_state.key`"):
        rd.fit(pred, data, getkey(), opt_state=state, **kw)
    # another random stream on purpose
    other = getkey()
    moved = eqx.tree_at(lambda s: s.key, state, other)
    _, _, after = fit_run(pred, data, other, opt_state=moved, **kw)
    assert after.step == 8


def test_save_checkpoint_bad_input(tmp_path):
    tree = {"a": jnp.zeros(2)}
    with pytest.raises(ValueError, match="`step` must be a non-negative integer"):
        retrax.save_checkpoint(tmp_path, -1, tree)
    with pytest.raises(TypeError, match="step"):
        retrax.save_checkpoint(tmp_path, 1.0, tree)
    with pytest.raises(ValueError, match="`keep` must be a positive integer"):
        retrax.save_checkpoint(tmp_path, 1, tree, keep=0)
    with pytest.raises(TypeError, match="`metadata` must be JSON-serialisable"):
        retrax.save_checkpoint(tmp_path, 1, tree, metadata={"x": object()})
    with pytest.raises(TypeError, match="directory"):
        retrax.save_checkpoint(None, 1, tree)
    # a file where a directory is expected is not "no checkpoint yet"
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="must be a directory of checkpoints"):
        retrax.load_checkpoint(tmp_path / "file", tree)
    (tmp_path / "file").unlink()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.float32
def test_resume_in_default_precision(getkey, tmp_path):
    # a float32 process (x64 off), the users' default
    data = jax.random.normal(getkey(), (64, 2))
    model = rd.TimeMLP(2, hidden=8, depth=1, key=getkey())
    pred, key = rd.NoisePredictor(model, rd.VPSDE()), getkey()
    kw = dict(KW, steps=6, ema=0.9)
    reference, ref_losses, ref_state = fit_run(pred, data, key, **kw)
    rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)
    (tmp_path / "checkpoint-000000006.ckpt").unlink()
    resumed, losses, state = fit_run(pred, data, key, checkpoint_dir=tmp_path, **kw)
    assert losses.dtype == jnp.float32
    assert_identical(params(resumed), params(reference))
    assert_identical(losses, ref_losses)
    assert_identical(state, ref_state)


# one object each, so that the calls share their compiled chunks
DIVERGING = optax.sgd(optax.piecewise_constant_schedule(1e-3, {10: 1e12}))


@pytest.mark.loud
def test_fit_diverging_schedule_keeps_the_finite_checkpoints(getkey, tmp_path):
    """The issue's run: the loss leaves the floats after step 10. It stops
    with an error, and every checkpoint left holds a finite state."""
    pred, data = tiny_training_problem(getkey)
    key = getkey()
    kw = fit_kwargs(optimizer=DIVERGING, steps=20, checkpoint_every=2)
    with pytest.raises(FloatingPointError, match=r"stopped at step 1\d ") as info:
        rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)
    assert str(tmp_path) in str(info.value)
    files = sorted(tmp_path.glob("checkpoint-*.ckpt"))
    assert len(files) == 3
    params, _ = eqx.partition(pred, eqx.is_inexact_array)
    like = {
        "state": rd.TrainState(params, DIVERGING.init(params), None, 0, key, None),
        "losses": jnp.zeros(20),
    }
    found = retrax.load_checkpoint(tmp_path, like)
    assert tree_is_finite(found.tree["state"].params)
    assert tree_is_finite(found.tree["state"].opt_state)
    # the steps before the failure are the ones an unchecked run takes
    stopped = found.step
    losses = rd.fit(
        pred, data, key, **fit_kwargs(optimizer=DIVERGING, steps=stopped)
    ).losses
    np.testing.assert_array_equal(found.tree["losses"][:stopped], losses)
    # running the script again resumes and stops at the same step, loudly
    with pytest.raises(FloatingPointError, match=r"stopped at step 1\d "):
        rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)


@pytest.mark.loud
def test_save_checkpoint_rotation_keeps_the_last_finite_checkpoint(tmp_path):
    good = {"w": jnp.ones(3)}
    bad = {"w": jnp.array([1.0, jnp.nan, 2.0])}
    retrax.save_checkpoint(tmp_path, 1, good, keep=2)
    for step in range(2, 6):
        retrax.save_checkpoint(tmp_path, step, bad, keep=2)
    names = sorted(p.name for p in tmp_path.glob("checkpoint-*.ckpt"))
    # the newest two, and the last finite one
    assert names == [f"checkpoint-00000000{s}.ckpt" for s in (1, 4, 5)]
    # the inf of a diverged run counts as non-finite too
    retrax.save_checkpoint(tmp_path, 6, {"w": jnp.full(3, jnp.inf)}, keep=2)
    names = sorted(p.name for p in tmp_path.glob("checkpoint-*.ckpt"))
    assert names == [f"checkpoint-00000000{s}.ckpt" for s in (1, 5, 6)]
    # once a finite state is saved again, the old one rotates away as usual
    retrax.save_checkpoint(tmp_path, 7, good, keep=2)
    names = sorted(p.name for p in tmp_path.glob("checkpoint-*.ckpt"))
    assert names == [f"checkpoint-00000000{s}.ckpt" for s in (6, 7)]


@pytest.fixture
def no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a training step ran before the check")

    monkeypatch.setattr(_train, "_train_chunk", refuse)


@pytest.mark.loud
def test_checkpoint_dir_under_a_regular_file(getkey, tmp_path, no_training):
    pred, data = tiny_training_problem(getkey)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for path in (blocker / "checkpoints", blocker):
        with pytest.raises(ValueError, match="`checkpoint_dir` .* is not a writable"):
            rd.fit(pred, data, getkey(), checkpoint_dir=path, **fit_kwargs(steps=5))
    assert blocker.read_text() == "not a directory"


@pytest.mark.loud
def test_checkpoint_dir_writable_leaves_no_probe(getkey, tmp_path, monkeypatch):
    pred, data = tiny_training_problem(getkey)
    target = tmp_path / "new" / "checkpoints"
    rd.fit(pred, data, getkey(), checkpoint_dir=target, **fit_kwargs(steps=2))
    assert sorted(p.name for p in target.iterdir()) == ["checkpoint-000000002.ckpt"]


@pytest.mark.loud
@pytest.mark.skipif(not pathlib.Path("/sys").is_dir(), reason="needs sysfs")
def test_checkpoint_dir_on_a_read_only_filesystem(getkey, no_training):
    """sysfs refuses new entries even to root (a chmod would not stop root)."""
    target = pathlib.Path("/sys/retrax-checkpoints")
    try:
        target.mkdir()
    except OSError:
        pass
    else:
        target.rmdir()
        pytest.skip("/sys accepts new directories here")
    pred, data = tiny_training_problem(getkey)
    with pytest.raises(ValueError, match="`checkpoint_dir` .* is not a writable"):
        rd.fit(pred, data, getkey(), checkpoint_dir=target, **fit_kwargs(steps=5))
