"""Training a noise predictor by denoising score matching."""

import dataclasses
import enum
import hashlib
import numbers
import os
import pathlib
import warnings
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, PyTree, Shaped
from tqdm.auto import tqdm

from .._checkpoint import (
    _newest_intact,
    _restore,
    _save,
    _signature,
    _signature_mismatch,
    _writable_directory,
)
from .._deprecated import deprecated_property, warn_deprecated
from .._distributed import _replicate, _same_arguments, _same_on_every_process
from .._misc import all_finite
from .._solution import AbstractSolution
from .._validate import check_positive_int, check_t_range
from ._predictor import AbstractPredictor
from ._solution import RESULTS


# one module-level default, so that repeated `fit` calls reuse the compiled chunk
_ADAM = optax.adam(1e-3)


class TrainState(eqx.Module):
    r"""Where a [`retrax.diffusion.fit`][] run stands: everything needed to continue it.

    The `state` of [`retrax.diffusion.fit_solution`][]'s answer, taken back
    by `fit(..., opt_state=state)`; two calls, the second continuing from the
    first, end bit-for-bit where one call with the summed steps ends. It is
    also what `fit`'s checkpoints hold.

    **Fields:**

    - `params`: the last iterate of the trained arrays (the floating-point
      arrays of the predictor, `eqx.partition(pred, eqx.is_inexact_array)[0]`;
      with `ema` this is not the returned predictor, which holds the average).
    - `opt_state`: the optimiser's state.
    - `average`: with `ema`, the running sum
      $a_T = (1 - d)\sum_{s=1}^T d^{T-s}\theta_s$ (the average before its bias
      correction $1/(1 - d^T)$); `None` without.
    - `step`: the number of optimiser steps taken since the start of training.
    - `key`: the PRNG key of the run; step $s$ draws its minibatch, times and
      noise from `jax.random.fold_in(key, s)`, so `(key, step)` is the whole
      PRNG state.
    - `ema`: the decay of the moving average, or `None`.
    """

    params: PyTree
    opt_state: PyTree
    average: PyTree | None
    step: int
    key: PRNGKeyArray
    ema: float | None = eqx.field(static=True)


def _key_data(key) -> np.ndarray:
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    return np.asarray(key)


def _same_key(a, b) -> bool:
    return (a.dtype == b.dtype) and np.array_equal(_key_data(a), _key_data(b))


def _check_fits(name: str, got, want) -> None:
    """`got` must have the leaves (paths, shapes, dtypes) of `want`."""
    detail = _signature_mismatch(_signature(got), _signature(want))
    if detail is None:
        return
    raise ValueError(
        f"`opt_state` was made for a different {name}: {detail}. Continue a run "
        "with the predictor and optimiser it was started with."
    )


def _fingerprint(data: jax.Array) -> str:
    host = np.ascontiguousarray(np.asarray(data))
    return f"{host.shape} {host.dtype} sha256:{hashlib.sha256(host).hexdigest()}"


def _spans_processes(mesh: Mesh) -> bool:
    return len({d.process_index for d in mesh.devices.flat}) > 1


def _initial_opt_state(optimizer, pred):
    """The state `optimizer.init` starts from (its array hyperparameters, such
    as `optax.inject_hyperparams`'), or why it cannot be made."""
    try:
        return optimizer.init(eqx.filter(pred, eqx.is_inexact_array))
    except Exception as err:  # `fit`'s own checks report bad arguments
        return f"<optimizer.init fails: {type(err).__name__}>"


def _param_dtype(params) -> jnp.dtype | None:
    for leaf in jax.tree.leaves(params):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.dtype
    return None


class _Stop(enum.IntEnum):
    """Why a step of [`retrax.diffusion.fit`][] was not applied: the code a
    compiled chunk reports for its first failed step (0 when none failed)."""

    none = 0
    loss = 1
    params = 2
    opt_state = 3
    # found by the check after a chunk, and not reproduced by the rerun that
    # checks every step's update: the chunk's last step is named
    chunk = 4


_STOP_MESSAGES = {
    _Stop.loss: "the minibatch loss is not finite",
    _Stop.params: "its update made the parameters non-finite",
    _Stop.opt_state: "its update made the optimiser state non-finite",
    _Stop.chunk: "the parameters or optimiser state became non-finite by this step",
}


class _ChunkConfig(eqx.Module):
    """What one compiled chunk of `fit` is specialised to.

    Every field fixes the compiled program (hashable, static), so two chunks
    with equal configurations share one compilation.

    - `chunk`: the steps of one `lax.scan`.
    - `batch_size`: rows per minibatch.
    - `t0`, `t1`: the interval training times are drawn from.
    - `ema`: the decay of the moving average, or `None`.
    - `split`: the sharding of a minibatch's rows over a mesh, or `None`.
    - `skip`: whether a failed step is skipped (`nonfinite="skip"`) rather than
      stopping the run.
    - `per_step`: whether every step checks the parameters and optimiser state
      its update makes (otherwise they are checked once, after the chunk).
    """

    chunk: int = eqx.field(static=True)
    batch_size: int = eqx.field(static=True)
    t0: float = eqx.field(static=True)
    t1: float = eqx.field(static=True)
    ema: float | None = eqx.field(static=True)
    split: NamedSharding | None = eqx.field(static=True)
    skip: bool = eqx.field(static=True)
    per_step: bool = eqx.field(static=True)


class _ChunkReport(NamedTuple):
    """A chunk's report, read on the host."""

    bad: int  # the first failed step, -1 when none
    why: _Stop
    skipped: int
    state_bad: bool  # the state after the chunk is not finite


def _local(values, mesh) -> tuple[np.ndarray, _ChunkReport]:
    """The chunk's losses and report: this process's copy of the replicated
    values (reading it is no collective, so processes may differ in
    `progress`), both read to the host."""
    losses, report = values
    if mesh is not None:
        losses = losses.addressable_data(0)
        report = report.addressable_data(0)
    bad, why, skipped, state_bad = (int(v) for v in np.asarray(report))
    return np.asarray(losses), _ChunkReport(bad, _Stop(why), skipped, bool(state_bad))


@eqx.filter_jit
def _train_chunk(
    params, opt_state, average, static, optimizer, data, key, start, end, config
):
    num, dtype = data.shape[0], data.dtype
    ema = config.ema
    # data parallel: each device computes its rows of every minibatch, drawn
    # from the one stream (threefry draws do not depend on their sharding), and
    # the mean over the split axis sums the devices' gradients
    if config.split is None:
        spread = lambda v: v
    else:
        spread = lambda v: jax.lax.with_sharding_constraint(v, config.split)

    def loss_fn(p, x0, t, eps):
        pred = eqx.combine(p, static)
        return jnp.mean(jax.vmap(pred.denoising_loss)(eps, x0, t))

    def step(carry, i):
        params, opt_state, average, bad, why, skipped = carry
        k_idx, k_t, k_eps = jax.random.split(jax.random.fold_in(key, i), 3)
        size = config.batch_size
        x0 = spread(data[jax.random.randint(k_idx, (size,), 0, num)])
        t = spread(jax.random.uniform(k_t, (size,), dtype, config.t0, config.t1))
        eps = spread(jax.random.normal(k_eps, x0.shape, dtype))
        loss, grads = jax.value_and_grad(loss_fn)(params, x0, t, eps)
        # optax's Adam mixes Python floats with its int32 step count, which a
        # caller's strict dtype promotion would reject
        with jax.numpy_dtype_promotion("standard"):
            updates, new_opt_state = optimizer.update(grads, opt_state, params)
        new_params = eqx.apply_updates(params, updates)
        if ema is None:
            new_average = average
        else:
            new_average = jax.tree.map(
                lambda a, p: ema * a + (1 - ema) * p, average, new_params
            )
        # a step whose loss is not finite is never applied: with
        # `nonfinite="raise"` the run stands still from there (and `fit`
        # stops after the chunk), with "skip" it goes on from the last finite
        # state. With `per_step` the step's parameters and optimiser state are
        # checked too (a reduction over each of their arrays); without it they
        # are checked once, after the chunk, and `fit` reruns a chunk that
        # fails with `per_step` to find the step. Those reductions are a few
        # small operations per array on the CPU, 5% of a step of the circle
        # MLP, and the update would have to wait for them.
        why_here = jnp.where(~jnp.isfinite(loss), int(_Stop.loss), int(_Stop.none))
        if config.per_step:
            why_here = jnp.where(
                why_here > 0,
                why_here,
                jnp.where(
                    ~all_finite(new_params),
                    int(_Stop.params),
                    jnp.where(
                        ~all_finite(new_opt_state),
                        int(_Stop.opt_state),
                        int(_Stop.none),
                    ),
                ),
            )
        why_here = why_here.astype(jnp.int32)
        # steps past the end of the run (the tail of the last chunk) are no-ops
        live = i < end
        failed = live & (why_here > 0)
        if config.skip:
            active = live & ~failed
            skipped = skipped + failed.astype(jnp.int32)
        else:
            active = live & ~failed & (bad < 0)
        first = failed & (bad < 0)
        bad = jnp.where(first, i, bad)
        why = jnp.where(first, why_here, why)
        keep = lambda new, old: jnp.where(active, new, old)
        params = jax.tree.map(keep, new_params, params)
        opt_state = jax.tree.map(keep, new_opt_state, opt_state)
        average = jax.tree.map(keep, new_average, average)
        return (params, opt_state, average, bad, why, skipped), loss

    idx = start + jnp.arange(config.chunk, dtype=jnp.int32)
    none = jnp.asarray(-1, jnp.int32)
    zero = jnp.asarray(0, jnp.int32)
    carry = (params, opt_state, average, none, zero, zero)
    (params, opt_state, average, bad, why, skipped), losses = jax.lax.scan(
        step, carry, idx
    )
    # the state after the chunk: not finite without a non-finite loss only
    # when a step's update was (found by rerunning the chunk with `per_step`)
    state_bad = ~(all_finite(params) & all_finite(opt_state))
    report = jnp.stack([bad, why, skipped, state_bad.astype(jnp.int32)])
    if config.split is not None:
        # the same on every device, so that each process reads its own copy
        whole = NamedSharding(config.split.mesh, PartitionSpec())
        params, opt_state, average, losses, report = jax.lax.with_sharding_constraint(
            (params, opt_state, average, losses, report), whole
        )
    return params, opt_state, average, losses, report


def _run_metadata(steps, start, batch_size, t0, t1, ema, data) -> dict:
    """What a checkpoint records of the run that wrote it, and what a resumed
    run must match."""
    return {
        "run": "retrax.diffusion.fit",
        "steps": steps,
        "start": start,
        "batch_size": batch_size,
        "t_range": [t0, t1],
        "ema": ema,
        "data": _fingerprint(data),
    }


def fit(
    pred: AbstractPredictor,
    data: Shaped[ArrayLike, "..."],
    key: PRNGKeyArray,
    *,
    optimizer: optax.GradientTransformation = _ADAM,
    steps: int,
    batch_size: int = 256,
    t_range: tuple[float, float] = (1e-3, 0.2),
    progress: bool = True,
    chunk_size: int = 1000,
    ema: float | None = None,
    opt_state: TrainState | None = None,
    return_state: bool | None = None,
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    mesh: Mesh | None = None,
    nonfinite: str = "raise",
    throw: bool = True,
) -> "TrainSolution":
    r"""Train a noise predictor by denoising score matching.

    Every step draws a minibatch of `batch_size` rows of `data` (with
    replacement), times $t \sim U(t_0, t_1)$ and noise $\epsilon \sim N(0, I)$,
    and takes one optimiser step on the mean of
    [`retrax.diffusion.AbstractPredictor.denoising_loss`][]. All floating-point
    arrays of `pred` are trained (for a `NoisePredictor`, the model's weights;
    the schedule's Python floats stay fixed). Step $s$ (counted from the start
    of training) draws from `jax.random.fold_in(key, s)`.

    ```python
    run = rd.fit(pred, data, key, steps=1000)
    trained, losses = run.value, run.losses
    ```

    The steps run as one jitted `lax.scan` per chunk of `chunk_size` steps
    (compiled once), and the progress bar advances between chunks.

    The default time range is the small-noise end, the noise levels implicit
    inference reads, not all of `[0, 1]`; use `t_range=(schedule.t_min, 1.0)`
    to train a sampler.

    With a constant step size the last iterate jitters around the minimum at
    about the step size, and the jitter carries into everything read off the
    network (on the circle example, the roots of the implicit field move by
    one or two hundredths over a few tens of steps). `ema` returns instead the
    exponential moving average of the iterates $\theta_1, \dots, \theta_T$,
    $\bar\theta = \frac{1 - d}{1 - d^T}\sum_{s=1}^T d^{T-s}\theta_s$ for the
    decay $d$ (bias-corrected, so the initialisation carries no weight;
    Polyak and Juditsky 1992; the parameter EMA of Ho et al. 2020). Its
    window is about $1/(1 - d)$ steps: a few hundred steps, a small part of
    the run, averages out the jitter without reaching back to a poorly trained
    network. The optimiser itself, and the loss history, are unchanged.

    **Continuing a run.** The answer's `state` (a
    [`retrax.diffusion.TrainState`][]) passed back as `opt_state` takes
    `steps` more steps from where the run stopped (the parameters, the
    optimiser's moments and step count, the moving average and the position
    in the random stream), with the same `key`:

    ```python
    run = rd.fit(pred, data, key, steps=1000)
    more = rd.fit(run.value, data, key, steps=500, opt_state=run.state)
    ```

    ends bit-for-bit where `fit(pred, data, key, steps=1500)` ends.

    **Checkpoints.** With `checkpoint_dir`, the run saves its
    [`retrax.diffusion.TrainState`][] and its loss history there (with
    [`retrax.save_checkpoint`][]: written atomically, with a
    checksum) every `checkpoint_every` steps, and at the end; the three newest
    are kept. A call whose `checkpoint_dir` holds a checkpoint of the same run
    resumes from the newest intact one (a damaged one is skipped with a
    warning naming it; the answer's `stats["resumed_from"]` is its step) and
    ends bit-for-bit where an uninterrupted run ends, so a script killed at
    any point can simply be run again. A checkpoint
    written by a different run (another predictor, optimiser state structure,
    dtype, `key`, `data`, `steps`, `batch_size`, `t_range`, `ema` or
    `opt_state`) raises a `ValueError` instead. The optimiser's
    hyperparameters (e.g. a learning rate) are not stored: resume with the
    same `optimizer`.

    **A diverging run stops.** Every step checks that its minibatch loss,
    and the parameters and optimiser state its update makes, are finite. A
    step that fails is not applied: with `nonfinite="raise"` (the default)
    the run stops there and, with `throw=True` (the default), `fit` raises a
    `FloatingPointError` naming the step (a NaN learning rate fails at step
    0; a schedule that grows to 1e12 at the step where the loss overflows);
    with `throw=False` it returns the run up to that step, its `result`
    `RESULTS.nonfinite_loss` or `RESULTS.nonfinite_update` and
    `stats["nonfinite_step"]` the step. With
    "raise" the compiled scan checks each step's loss and, after each chunk,
    the parameters and optimiser state; a chunk that fails runs again with
    every step's update checked, to name the step, so the checks cost a
    healthy run next to nothing. No checkpoint of a
    non-finite state is written, so `checkpoint_dir` still holds the last
    finite states. With `nonfinite="skip"` such steps are skipped (the
    parameters, optimiser state and average stay those of the last finite
    step; the step still counts, and its loss is recorded), counted in
    `stats["num_skipped"]`, and a `RuntimeWarning` at the end says how many
    were.

    **Data parallelism.** With `mesh` (e.g. [`retrax.batch_mesh`][]`()`, over
    every device of every process of `jax.distributed`), every minibatch is
    split along its rows over the mesh's devices: each device computes the
    loss and gradient of its rows, and the gradients are summed across the
    devices (and processes) before the optimiser's step. The minibatches are
    drawn from the same stream as without `mesh` (each process draws its
    share of every global minibatch of `batch_size` rows, and the combined
    batch is the shares in process order), so the run takes the steps of a
    single-process run with the same `batch_size`, equal to rounding; the
    parameters and optimiser state are replicated, the same on every process
    after every step. Every process calls `fit` with the same arguments
    (`data` whole on every process), and this is checked with one collective
    before anything else: `steps`, `batch_size`, `chunk_size`, `t_range`,
    `ema`, `nonfinite`, `checkpoint_every`, `key`, `data`, the predictor's
    arrays, the optimiser (its code and the values its functions close over,
    e.g. a learning rate or a schedule, and the arrays of `optimizer.init`)
    and `opt_state`; one that differs raises a `ValueError` on every process
    naming it and what each process holds, so that no process waits forever
    for a peer. Only `progress`, `throw` and `return_state` may differ.
    `checkpoint_dir` is refused with a mesh that spans several processes;
    the answer's `state` and `opt_state` continue such a run.

    **Arguments:**

    - `pred`: the predictor to train. When continuing (`opt_state`), it gives
      the structure and the trained arrays come from `opt_state.params`.
    - `data`: the training set, shape `(num, dim)`, one example per row.
    - `key`: a PRNG key for minibatches, times and noise.
    - `optimizer`: an optax gradient transformation.
    - `steps`: the number of optimiser steps this call takes.
    - `batch_size`: examples per step.
    - `t_range`: the interval `(t0, t1)` of training times, inside `[0, 1]`.
    - `progress`: show a tqdm progress bar.
    - `chunk_size`: steps per compiled scan (and per progress-bar update).
    - `ema`: the decay $d \in [0, 1)$ of an exponential moving average of the
      parameters, returned in place of the last iterate (e.g. `0.995`); `None`
      (the default) returns the last iterate.
    - `opt_state`: a [`retrax.diffusion.TrainState`][] of an earlier call
      (`fit(...).state`) to continue from; `None` starts afresh
      with `optimizer.init`.
    - `return_state`: deprecated and ignored: the answer's `state` field
      holds the state. Passing it warns with a `DeprecationWarning`; the
      argument goes in the next release.
    - `checkpoint_dir`: a directory to checkpoint into and resume from;
      `None` (the default) writes nothing. It is created if missing and
      proved writable (a probe file is written and removed) before the
      first step: a path under a regular file, or on a read-only
      filesystem, raises a `ValueError` naming `checkpoint_dir` at once.
    - `checkpoint_every`: save every this many steps (a positive integer; the
      chunks are shortened to it if `chunk_size` is longer); `None` saves at
      the end of every chunk. Needs `checkpoint_dir`.
    - `mesh`: a `jax.sharding.Mesh` to run data-parallel on; every minibatch
      is split over all its axes, so `batch_size` must be a multiple of its
      number of devices. `None` (the default) runs on the default device.
    - `nonfinite`: what a step with a non-finite loss or update does:
      `"raise"` (the default) stops the run there, `"skip"` skips the step
      and warns at the end.
    - `throw`: with `nonfinite="raise"`, whether a run that stops raises a
      `FloatingPointError` naming the step (`True`, the default) or returns
      the run up to there with its result code (`False`).

    **Returns:**

    A [`retrax.diffusion.TrainSolution`][]: `value` is the trained predictor
    (the last iterate, or the moving average with `ema`), `losses` the
    minibatch loss of every step of this call, shape `(steps,)` (after a
    resume from a checkpoint, the whole run's), `state` where the run stands.

    **Raises:**

    `ValueError` or `TypeError` naming the argument for bad arguments
    (including a `checkpoint_dir` that cannot be written, found before the
    first step); `FloatingPointError` naming the step when a step's loss or
    update is not finite (with `nonfinite="raise"` and `throw=True`).
    """
    if return_state is not None:
        warn_deprecated(
            "`fit(..., return_state=...)` is deprecated and ignored: `fit` returns "
            "a `TrainSolution`, whose `.state` is the state."
        )
    if isinstance(mesh, Mesh) and _spans_processes(mesh):
        # first, before any check that could raise on some processes only
        # and leave the others waiting in a collective
        _agree_across_processes(
            {
                "steps": steps,
                "batch_size": batch_size,
                "chunk_size": chunk_size,
                "checkpoint_every": checkpoint_every,
                "checkpoint_dir": None if checkpoint_dir is None else "a path",
                "t_range": t_range,
                "ema": ema,
                "nonfinite": nonfinite,
                "key": key,
                "data": data,
                "pred": pred,
                "optimizer": optimizer,
                "optimizer.init(pred)": _initial_opt_state(optimizer, pred),
                "opt_state": opt_state,
                "mesh": [mesh.axis_names, [d.id for d in mesh.devices.flat]],
            }
        )
    ema, t0, t1 = _check_arguments(
        steps=steps,
        batch_size=batch_size,
        chunk_size=chunk_size,
        nonfinite=nonfinite,
        ema=ema,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        mesh=mesh,
        opt_state=opt_state,
        t_range=t_range,
    )
    params, static = eqx.partition(pred, eqx.is_inexact_array)
    data = _check_data(data, pred, _param_dtype(params), mesh, t1)
    state = _start_state(params, optimizer, key, ema, opt_state)
    start = state.step
    config = _ChunkConfig(
        chunk=min(chunk_size, steps, checkpoint_every or steps),
        batch_size=batch_size,
        t0=t0,
        t1=t1,
        ema=ema,
        split=None
        if mesh is None
        else NamedSharding(mesh, PartitionSpec(mesh.axis_names)),
        skip=nonfinite == "skip",
        # "skip" decides at every step; "raise" checks the parameters and
        # optimiser state after each chunk, and a chunk that fails runs again
        # with the checks of every step to name the step
        per_step=nonfinite == "skip",
    )
    metadata = None
    resumed_from = -1
    history = []
    if checkpoint_dir is not None:
        metadata = _run_metadata(steps, start, batch_size, t0, t1, ema, data)
        found = _resume(checkpoint_dir, metadata, state, key, steps, data.dtype)
        if found is not None:
            state, losses_so_far = found
            resumed_from = state.step
            history.append(losses_so_far)
    run = _run_chunks(
        state,
        start,
        history,
        static=static,
        optimizer=optimizer,
        data=data,
        mesh=mesh,
        config=config,
        steps=steps,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        metadata=metadata,
        progress=progress,
    )
    if run.stopped is not None and throw:
        raise FloatingPointError(run.stopped)
    if run.skipped:
        warnings.warn(
            f"`fit` skipped {run.skipped} of {steps} steps whose loss or update was "
            "not finite (`nonfinite='skip'`): their updates were not applied, and "
            "the parameters are those of the last finite step.",
            RuntimeWarning,
            stacklevel=2,
        )
    return _solution(run, static, start, resumed_from)


def fit_solution(
    pred: AbstractPredictor,
    data: Shaped[ArrayLike, "..."],
    key: PRNGKeyArray,
    **kwargs,
) -> "TrainSolution":
    """Deprecated: [`retrax.diffusion.fit`][] returns the
    [`retrax.diffusion.TrainSolution`][] this returned.

    Calls `fit(pred, data, key, **kwargs)` after a `DeprecationWarning`; it
    goes in the next release.
    """
    warn_deprecated(
        "`fit_solution` is deprecated: `fit` takes the same arguments and returns "
        "the same `TrainSolution`."
    )
    return fit(pred, data, key, **kwargs)


class TrainSolution(AbstractSolution):
    """A whole [`retrax.diffusion.fit`][] run.

    **Attributes:**

    - `value`: the trained predictor (the last iterate, or the moving average
      with `ema`; for a run stopped at a non-finite step, that of the last
      finite step).
    - `losses`: the minibatch loss of every step, shape `(steps,)` (after a
      resume from a checkpoint, the whole run's; for a stopped run, up to and
      including the step that stopped it).
    - `state`: the [`retrax.diffusion.TrainState`][] at the end, to continue
      the run with `opt_state=state`.
    - `result`: a [`retrax.diffusion.RESULTS`][] code: `successful` for a run
      that took all its steps (with `nonfinite="skip"`, its skipped steps
      counted in `stats`), or, for a run stopped at a step whose loss or
      update was not finite (`nonfinite="raise"` with `throw=False`; with
      `throw=True` such a run raises a `FloatingPointError` instead),
      `nonfinite_loss` (the step's minibatch loss) or `nonfinite_update` (the
      parameters or optimiser state its update made).
    - `stats`: a dict of integer arrays (see
      [`retrax.diffusion.AbstractSolution`][]):
      - `num_steps`: the optimiser steps of the run, `steps` (those a
        resumed checkpoint had taken included), or for a stopped run those
        before the step that stopped it;
      - `num_skipped`: how many of them were skipped as non-finite
        (`nonfinite="skip"`);
      - `resumed_from`: the step of the checkpoint this call resumed from,
        -1 when it did not resume one;
      - `nonfinite_step`: the step (counted from 0 at the start of training)
        that stopped the run, -1 when none did.

    `pred` is a deprecated alias of `value`.
    """

    value: AbstractPredictor
    losses: Float[Array, " steps"]
    state: TrainState
    result: RESULTS
    stats: dict[str, Array]

    pred = deprecated_property("TrainSolution.pred", ".value", lambda s: s.value)


def _agree_across_processes(arguments: dict) -> None:
    """Raise on every process unless every process passed `fit` the same
    `arguments` (a collective, made before any check that could fail on some
    processes only)."""
    _same_arguments(
        arguments,
        "call `fit` with the same arguments (all but `progress`, `throw` and "
        "`return_state`)",
    )


def _check_arguments(
    *,
    steps,
    batch_size,
    chunk_size,
    nonfinite,
    ema,
    checkpoint_dir,
    checkpoint_every,
    mesh,
    opt_state,
    t_range,
) -> tuple[float | None, float, float]:
    """Check `fit`'s arguments but `data` (eagerly, naming the argument);
    return `ema` and the two ends of `t_range` as Python floats."""
    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    check_positive_int("chunk_size", chunk_size)
    if nonfinite not in ("raise", "skip"):
        raise ValueError(f"`nonfinite` must be 'raise' or 'skip', got {nonfinite!r}.")
    if ema is not None:
        if isinstance(ema, bool) or not isinstance(ema, numbers.Real):
            raise TypeError(f"`ema` must be a float decay or None, got {ema!r}.")
        ema = float(ema)
        if not 0.0 <= ema < 1.0:
            raise ValueError(f"`ema` must be a decay in [0, 1), got {ema}.")
    if checkpoint_every is not None:
        if isinstance(checkpoint_every, bool) or not isinstance(checkpoint_every, int):
            raise TypeError(
                "`checkpoint_every` must be a positive integer (a number of "
                f"steps) or None, got {checkpoint_every!r}."
            )
        if checkpoint_every < 1:
            raise ValueError(
                "`checkpoint_every` must be a positive integer (a number of "
                f"steps) or None, got {checkpoint_every!r}."
            )
        if checkpoint_dir is None:
            raise ValueError(
                "`checkpoint_every` needs `checkpoint_dir`, the directory to "
                "write the checkpoints to."
            )
    if checkpoint_dir is not None and not isinstance(checkpoint_dir, str | os.PathLike):
        raise TypeError(
            f"`checkpoint_dir` must be a path or None, got {checkpoint_dir!r}."
        )
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise TypeError(
                f"`mesh` must be a jax.sharding.Mesh or None, got {mesh!r}."
            )
        if batch_size % mesh.size:
            processes = len({d.process_index for d in mesh.devices.flat})
            raise ValueError(
                f"`batch_size` ({batch_size}) must be a multiple of the "
                f"{mesh.size} devices of `mesh` (on {processes} processes), so "
                "that every device computes an equal share of each minibatch."
            )
        if checkpoint_dir is not None and any(
            d.process_index != jax.process_index() for d in mesh.devices.flat
        ):
            raise ValueError(
                "`checkpoint_dir` is not supported with a `mesh` that spans "
                "several processes: continue such a run with `opt_state=` and the "
                "`state` of `fit`'s answer, saving the state with "
                "`save_checkpoint` on one process."
            )
    if opt_state is not None and not isinstance(opt_state, TrainState):
        raise TypeError(
            "`opt_state` must be the `TrainState` of an earlier run "
            f"(`fit(...).state`), got {type(opt_state).__name__}."
        )
    t0, t1 = check_t_range(t_range)
    return ema, t0, t1


def _check_data(data, pred, dtype, mesh, t1) -> Array:
    """`data` checked (a finite 2-D floating array whose rows `pred` takes,
    the same on every process of `mesh`) and cast to the parameters' `dtype`."""
    data = jnp.asarray(data)
    if data.ndim != 2 or data.shape[0] == 0:
        raise ValueError(
            "`data` must have shape (num_examples, dim), one example per row, "
            f"got shape {data.shape}."
        )
    if not jnp.issubdtype(data.dtype, jnp.floating):
        raise TypeError(f"`data` must have a real floating dtype, got {data.dtype}.")
    if not bool(jnp.all(jnp.isfinite(data))):
        bad = int(jnp.sum(~jnp.all(jnp.isfinite(data), axis=1)))
        raise ValueError(
            f"`data` must be finite: {bad} of {data.shape[0]} rows hold NaN or inf."
        )
    if dtype is not None:
        data = data.astype(dtype)
    if mesh is not None:
        # a collective: every process of the mesh reaches it with its `data`
        _same_on_every_process("data", [_fingerprint(data)], "the same training set")
    try:
        jax.eval_shape(pred.epsilon, data[0], jnp.asarray(t1, data.dtype))
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"the predictor cannot take one row of `data` (shape "
            f"{data.shape[1:]}): {err}"
        ) from err
    return data


def _start_state(params, optimizer, key, ema, opt_state) -> TrainState:
    """The state the run starts from: afresh, or `opt_state` checked to
    belong to this predictor, optimiser, `ema` and `key`."""
    if opt_state is None:
        return TrainState(
            params=params,
            opt_state=optimizer.init(params),
            # the moving average starts at zero and is bias-corrected at the end
            average=None if ema is None else jax.tree.map(jnp.zeros_like, params),
            step=0,
            key=key,
            ema=ema,
        )
    _check_fits("predictor", opt_state.params, params)
    _check_fits(
        "optimiser", opt_state.opt_state, jax.eval_shape(optimizer.init, params)
    )
    if opt_state.ema != ema:
        raise ValueError(
            f"`ema` is {ema}, but `opt_state` comes from a run with "
            f"ema={opt_state.ema}: continue with the same decay."
        )
    if not _same_key(opt_state.key, key):
        raise ValueError(
            "`key` differs from `opt_state.key`, the key of the run being "
            "continued: pass the same key (or replace `opt_state.key` with "
            "`eqx.tree_at` to continue on another random stream)."
        )
    return opt_state


def _resume(
    checkpoint_dir, metadata: dict, state: TrainState, key, steps: int, dtype
) -> tuple[TrainState, np.ndarray] | None:
    """The state and loss history of the newest intact checkpoint of this run
    in `checkpoint_dir` (proved writable first), or `None` when it holds none.

    A checkpoint whose `metadata` differs, or whose key or step does not fit
    this run, raises a `ValueError` saying how to resume or start afresh.
    """
    # before the first step, not at the first save a chunk later
    _writable_directory(checkpoint_dir, "checkpoint_dir")
    newest = _newest_intact(pathlib.Path(checkpoint_dir))
    if newest is None:
        return None
    path, header, _ = newest
    for name, value in metadata.items():
        saved = header["metadata"].get(name)
        if saved == value:
            continue
        if name == "run":
            detail = "it was not written by `fit`"
        elif name == "data":
            detail = "it was trained on other `data`"
        elif name == "start":
            detail = (
                f"it continued an `opt_state` at step {saved}, this "
                f"call starts at step {value}"
            )
        else:
            detail = f"`{name}` is {saved!r} there and {value!r} here"
        raise ValueError(
            f"the checkpoint {path} belongs to another run "
            f"({detail}): pass the same arguments to resume it, another "
            "`checkpoint_dir`, or delete its checkpoints to start afresh."
        )
    like = {"state": state, "losses": jnp.zeros(steps, dtype)}
    found = _restore(*newest, like)
    if not _same_key(found.tree["state"].key, key):
        raise ValueError(
            f"the checkpoint {found.path} belongs to a run with another "
            "`key`: pass the same key to resume, or another `checkpoint_dir`."
        )
    resumed = found.tree["state"]
    done = resumed.step - state.step
    if not 0 <= done <= steps:
        raise ValueError(
            f"the checkpoint {found.path} is at step {resumed.step}, "
            f"outside this run's steps {state.step} to {state.step + steps}."
        )
    return resumed, np.asarray(found.tree["losses"][:done])


class _Run(NamedTuple):
    """Where the chunk loop of `fit` ended."""

    state: TrainState  # its `step` is the steps applied (up to a stop)
    losses: np.ndarray
    skipped: int
    stopped: str | None  # why the run stopped at a non-finite step, or None
    stop_step: int  # the step that stopped the run, -1 when none did
    why: _Stop  # what failed at `stop_step`


def _run_chunks(
    state: TrainState,
    start: int,
    history: list[np.ndarray],
    *,
    static,
    optimizer,
    data,
    mesh,
    config: _ChunkConfig,
    steps: int,
    checkpoint_dir,
    checkpoint_every,
    metadata,
    progress: bool,
) -> _Run:
    """Train from `state` (at `start + len(losses so far)`) to step
    `start + steps`, one compiled chunk at a time, saving checkpoints and
    stopping at the first failed step (unless `config.skip`).

    The loss history stays on the host (NumPy): a device array per chunk,
    concatenated or padded at each checkpoint, would compile a program for
    every new length and keep it, so memory would grow with every chunk.
    """
    key, ema = state.key, state.ema
    end = start + steps
    done = sum(len(h) for h in history)
    params, opt, average = state.params, state.opt_state, state.average
    if mesh is not None:
        data, run_key, params, opt, average = _replicate(
            (data, key, params, opt, average), mesh
        )
    else:
        run_key = key
    skipped = 0
    every = checkpoint_every or config.chunk
    with tqdm(
        total=steps, initial=done, disable=not progress, desc="fit", unit="step"
    ) as bar:
        while done < steps:
            n = min(config.chunk, steps - done)
            chunk_args = (
                static,
                optimizer,
                data,
                run_key,
                jnp.asarray(start + done, jnp.int32),
                jnp.asarray(end, jnp.int32),
            )
            new = _train_chunk(params, opt, average, *chunk_args, config)
            losses, report = _local(new[3:], mesh)
            bad, why = report.bad, report.why
            if (bad >= 0 or report.state_bad) and not config.skip:
                # the same steps again, each checking its update, to name the
                # first that failed
                per_step = dataclasses.replace(config, per_step=True)
                new = _train_chunk(params, opt, average, *chunk_args, per_step)
                losses, (bad, why, _, _) = _local(new[3:], mesh)
                if bad < 0:  # not reproduced: name the chunk
                    bad, why = start + done + n - 1, _Stop.chunk
            skipped += report.skipped
            if bad >= 0 and not config.skip:
                message = _stop_message(
                    bad, why, float(losses[bad - start - done]), checkpoint_dir
                )
                if why == _Stop.chunk:
                    # no step of the chunk fails alone, but its end state is
                    # not finite: the run stands before the chunk
                    state = TrainState(params, opt, average, start + done, key, ema)
                else:
                    params, opt, average = new[:3]
                    history.append(losses[: bad - start - done + 1])
                    state = TrainState(params, opt, average, bad, key, ema)
                losses = _joined(history, data.dtype)
                return _Run(state, losses, skipped, message, bad, why)
            params, opt, average = new[:3]
            history.append(losses[:n])
            previous, done = done, done + n
            if progress:
                bar.update(n)
                bar.set_postfix(loss=f"{float(np.mean(losses[:n])):.4g}")
            if checkpoint_dir is not None and (
                done == steps or done // every > previous // every
            ):
                state = TrainState(params, opt, average, start + done, key, ema)
                padded = np.zeros(steps, losses.dtype)
                padded[:done] = np.concatenate(history)
                _save(
                    checkpoint_dir,
                    start + done,
                    {"state": state, "losses": jnp.asarray(padded)},
                    metadata=metadata,
                    keep=3,
                    finite_part=state,
                )
    state = TrainState(params, opt, average, end, key, ema)
    return _Run(state, _joined(history, data.dtype), skipped, None, -1, _Stop.none)


def _joined(history: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(history) if history else np.zeros(0, dtype)


def _stop_message(step: int, why: _Stop, loss: float, checkpoint_dir) -> str:
    saved = ""
    if checkpoint_dir is not None:
        saved = f" The checkpoints in {checkpoint_dir} hold finite states."
    return (
        f"`fit` stopped at step {step} (counting from 0 at the start of "
        f"training): {_STOP_MESSAGES[why]} (loss {loss:.6g}). A learning rate "
        "too large, NaN or inf, or a schedule that grows, makes the "
        f"run diverge. No update of a step from {step} on was "
        f"applied.{saved} Lower the learning rate, "
        "or pass `nonfinite='skip'` to skip such steps."
    )


def _solution(run: _Run, static, start: int, resumed_from: int) -> TrainSolution:
    """The `TrainSolution` of a finished (or stopped) run: the predictor of
    its last iterate or, with `ema`, of its bias-corrected average."""
    state = run.state
    params = state.params
    if state.ema is not None and state.step > 0:
        correction = 1.0 / (1.0 - state.ema**state.step)
        params = jax.tree.map(lambda a: (a * correction).astype(a.dtype), state.average)
    if run.stopped is None:
        result = RESULTS.successful
    elif run.why == _Stop.loss:
        result = RESULTS.nonfinite_loss
    else:
        result = RESULTS.nonfinite_update
    stats = {
        "num_steps": jnp.asarray(state.step - start),
        "num_skipped": jnp.asarray(run.skipped),
        "resumed_from": jnp.asarray(resumed_from),
        "nonfinite_step": jnp.asarray(run.stop_step),
    }
    return TrainSolution(
        value=eqx.combine(params, static),
        losses=jnp.asarray(run.losses),
        state=state,
        result=result,
        stats=stats,
    )
