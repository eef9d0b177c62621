"""Training a noise predictor by denoising score matching."""

import hashlib
import numbers
import os
import pathlib
import warnings

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
from .._distributed import _replicate, _same_arguments, _same_on_every_process
from .._misc import all_finite
from .._solution import AbstractSolution
from .._validate import check_positive_int, static_float
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


_WHY = {
    1: "the minibatch loss is not finite",
    2: "its update made the parameters non-finite",
    3: "its update made the optimiser state non-finite",
    4: "the parameters or optimiser state became non-finite by this step",
}


def _local(values, mesh):
    """The chunk's losses and report: this process's copy of the replicated
    values (reading it is no collective, so processes may differ in
    `progress`), the report as a NumPy array."""
    losses, report = values
    if mesh is not None:
        losses = losses.addressable_data(0)
        report = report.addressable_data(0)
    return losses, np.asarray(report)


@eqx.filter_jit
def _train_chunk(
    params, opt_state, average, static, optimizer, data, key, start, end, config
):
    chunk, batch_size, t0, t1, ema, split, skip, per_step = config
    num, dtype = data.shape[0], data.dtype
    # data parallel: each device computes its rows of every minibatch, drawn
    # from the one stream (threefry draws do not depend on their sharding), and
    # the mean over the split axis sums the devices' gradients
    if split is None:
        spread = lambda v: v
    else:
        spread = lambda v: jax.lax.with_sharding_constraint(v, split)

    def loss_fn(p, x0, t, eps):
        pred = eqx.combine(p, static)
        return jnp.mean(jax.vmap(pred.denoising_loss)(eps, x0, t))

    def step(carry, i):
        params, opt_state, average, bad, why, skipped = carry
        k_idx, k_t, k_eps = jax.random.split(jax.random.fold_in(key, i), 3)
        x0 = spread(data[jax.random.randint(k_idx, (batch_size,), 0, num)])
        t = spread(jax.random.uniform(k_t, (batch_size,), dtype, t0, t1))
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
        # raises after the chunk), with "skip" it goes on from the last finite
        # state. With `per_step` the step's parameters and optimiser state are
        # checked too (a reduction over each of their arrays); without it they
        # are checked once, after the chunk, and `fit` reruns a chunk that
        # fails with `per_step` to find the step. Those reductions are a few
        # small operations per array on the CPU, 5% of a step of the circle
        # MLP, and the update would have to wait for them.
        why_here = jnp.where(~jnp.isfinite(loss), 1, 0)
        if per_step:
            why_here = jnp.where(
                why_here > 0,
                why_here,
                jnp.where(
                    ~all_finite(new_params),
                    2,
                    jnp.where(~all_finite(new_opt_state), 3, 0),
                ),
            )
        why_here = why_here.astype(jnp.int32)
        # steps past the end of the run (the tail of the last chunk) are no-ops
        live = i < end
        failed = live & (why_here > 0)
        if skip:
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

    idx = start + jnp.arange(chunk, dtype=jnp.int32)
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
    if split is not None:
        # the same on every device, so that each process reads its own copy
        whole = NamedSharding(split.mesh, PartitionSpec())
        params, opt_state, average, losses, report = jax.lax.with_sharding_constraint(
            (params, opt_state, average, losses, report), whole
        )
    return params, opt_state, average, losses, report


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
) -> (
    tuple[AbstractPredictor, Float[Array, " steps"]]
    | tuple[AbstractPredictor, Float[Array, " steps"], TrainState]
):
    r"""Train a noise predictor by denoising score matching.

    Every step draws a minibatch of `batch_size` rows of `data` (with
    replacement), times $t \sim U(t_0, t_1)$ and noise $\epsilon \sim N(0, I)$,
    and takes one optimiser step on the mean of
    [`retrax.diffusion.AbstractPredictor.denoising_loss`][]. All floating-point
    arrays of `pred` are trained (for a `NoisePredictor`, the model's weights;
    the schedule's Python floats stay fixed). Step $s$ (counted from the start
    of training) draws from `jax.random.fold_in(key, s)`.

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

    **Continuing a run.** [`retrax.diffusion.fit_solution`][] trains as
    `fit` does and returns the whole run, a
    [`retrax.diffusion.TrainSolution`][], whose `state` (a
    [`retrax.diffusion.TrainState`][]) passed back as `opt_state` takes
    `steps` more steps from where the run stopped (the parameters, the
    optimiser's moments and step count, the moving average and the position
    in the random stream), with the same `key`:

    ```python
    run = rd.fit_solution(pred, data, key, steps=1000)
    more = rd.fit_solution(run.pred, data, key, steps=500, opt_state=run.state)
    ```

    ends bit-for-bit where `fit(pred, data, key, steps=1500)` ends.

    **Checkpoints.** With `checkpoint_dir`, the run saves its
    [`retrax.diffusion.TrainState`][] and its loss history there (with
    [`retrax.save_checkpoint`][]: written atomically, with a
    checksum) every `checkpoint_every` steps, and at the end; the three newest
    are kept. A call whose `checkpoint_dir` holds a checkpoint of the same run
    resumes from the newest intact one (a damaged one is skipped with a
    warning naming it) and ends bit-for-bit where an uninterrupted run ends,
    so a script killed at any point can simply be run again. A checkpoint
    written by a different run (another predictor, optimiser state structure,
    dtype, `key`, `data`, `steps`, `batch_size`, `t_range`, `ema` or
    `opt_state`) raises a `ValueError` instead. The optimiser's
    hyperparameters (e.g. a learning rate) are not stored: resume with the
    same `optimizer`.

    **A diverging run stops.** Every step checks that its minibatch loss,
    and the parameters and optimiser state its update makes, are finite. A
    step that fails is not applied: with `nonfinite="raise"` (the default)
    the run stands still from there and `fit` raises a `FloatingPointError`
    naming the step (a NaN learning rate fails at step 0; a schedule that
    grows to 1e12 at the step where the loss overflows). With "raise" the
    compiled scan checks each step's loss and, after each chunk, the
    parameters and optimiser state; a chunk that fails runs again with every
    step's update checked, to name the step, so the checks cost a healthy
    run next to nothing. No checkpoint of a
    non-finite state is written, so `checkpoint_dir` still holds the last
    finite states. With `nonfinite="skip"` such steps are skipped (the
    parameters, optimiser state and average stay those of the last finite
    step; the step still counts, and its loss is recorded), and a
    `RuntimeWarning` at the end says how many were.

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
    for a peer. Only `progress` and `return_state` may differ. `checkpoint_dir` is
    refused with a mesh that spans several processes;
    [`retrax.diffusion.fit_solution`][]'s `state` and `opt_state` continue
    such a run.

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
      (`fit_solution(...).state`) to continue from; `None` starts afresh
      with `optimizer.init`.
    - `return_state`: deprecated: use [`retrax.diffusion.fit_solution`][],
      whose `state` field holds it. `return_state=True` still returns
      `(trained_pred, losses, state)`, with a `DeprecationWarning`; the
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
      `"raise"` (the default) stops the run with a `FloatingPointError`
      naming the step, `"skip"` skips the step and warns at the end.

    **Returns:**

    `(trained_pred, losses)` (or, deprecated, `(trained_pred, losses, state)`
    with `return_state=True`). `losses` holds the minibatch loss of every step of
    this call, shape `(steps,)` (after a resume from a checkpoint, the whole
    run's). `trained_pred` holds the last iterate, or the moving average with
    `ema`.

    **Raises:**

    `ValueError` or `TypeError` naming the argument for bad arguments
    (including a `checkpoint_dir` that cannot be written, found before the
    first step); `FloatingPointError` naming the step when a step's loss or
    update is not finite (with `nonfinite="raise"`).
    """
    if return_state is not None:
        warnings.warn(
            "`fit(..., return_state=...)` is deprecated: call `fit_solution` with "
            "the same arguments (without `return_state`); its `.pred`, `.losses` "
            "and `.state` are what `fit` returned.",
            DeprecationWarning,
            stacklevel=2,
        )
    run = fit_solution(
        pred,
        data,
        key,
        optimizer=optimizer,
        steps=steps,
        batch_size=batch_size,
        t_range=t_range,
        progress=progress,
        chunk_size=chunk_size,
        ema=ema,
        opt_state=opt_state,
        checkpoint_dir=checkpoint_dir,
        checkpoint_every=checkpoint_every,
        mesh=mesh,
        nonfinite=nonfinite,
    )
    if return_state:
        return run.pred, run.losses, run.state
    return run.pred, run.losses


class TrainSolution(AbstractSolution):
    """A whole [`retrax.diffusion.fit`][] run, from
    [`retrax.diffusion.fit_solution`][].

    **Attributes:**

    - `pred`: the trained predictor (the last iterate, or the moving average
      with `ema`), what `fit` returns first.
    - `losses`: the minibatch loss of every step, shape `(steps,)`, what
      `fit` returns second.
    - `state`: the [`retrax.diffusion.TrainState`][] at the end, to continue
      the run with `opt_state=state`.
    - `result`: `RESULTS.successful`: a run that meets a non-finite step
      raises a `FloatingPointError` (`nonfinite="raise"`) or skips the step
      (`nonfinite="skip"`, counted in `stats`), so a run that returns has
      finite parameters.
    - `stats`: `{"num_steps": ..., "num_skipped": ...}`: the optimiser steps
      of this call, and how many of them were skipped as non-finite (see
      [`retrax.diffusion.AbstractSolution`][]).
    """

    pred: AbstractPredictor
    losses: Float[Array, " steps"]
    state: TrainState
    result: RESULTS
    stats: dict[str, Array]


def fit_solution(
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
    checkpoint_dir: str | os.PathLike | None = None,
    checkpoint_every: int | None = None,
    mesh: Mesh | None = None,
    nonfinite: str = "raise",
) -> "TrainSolution":
    """Train a noise predictor as [`retrax.diffusion.fit`][] does, and return
    the whole run.

    The same run, the same arguments (all but `fit`'s deprecated
    `return_state`), the same checks, checkpoints and errors; the answer is
    one [`retrax.diffusion.TrainSolution`][] instead of a tuple:

    ```python
    run = rd.fit_solution(pred, data, key, steps=1000)
    run.pred, run.losses  # what `fit` returns
    more = rd.fit_solution(run.pred, data, key, steps=500, opt_state=run.state)
    ```

    **Arguments:**

    As in [`retrax.diffusion.fit`][].

    **Returns:**

    A [`retrax.diffusion.TrainSolution`][].
    """
    if isinstance(mesh, Mesh) and _spans_processes(mesh):
        # first, before any check that could raise on some processes only
        # and leave the others waiting in a collective
        _same_arguments(
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
            },
            "call `fit` with the same arguments (all but `progress` and "
            "`return_state`)",
        )
    check_positive_int("steps", steps)
    check_positive_int("batch_size", batch_size)
    check_positive_int("chunk_size", chunk_size)
    if nonfinite not in ("raise", "skip"):
        raise ValueError(f"`nonfinite` must be 'raise' or 'skip', got {nonfinite!r}.")
    skip = nonfinite == "skip"
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
                "`state` of `fit_solution`, saving the state with `save_checkpoint` "
                "on one process."
            )
    if opt_state is not None and not isinstance(opt_state, TrainState):
        raise TypeError(
            "`opt_state` must be the `TrainState` of an earlier run "
            f"(`fit_solution(...).state`), got {type(opt_state).__name__}."
        )
    t0, t1 = (static_float("t_range", v) for v in t_range)
    if not 0.0 <= t0 < t1 <= 1.0:
        raise ValueError(
            f"`t_range` must be an interval (t0, t1) with 0 <= t0 < t1 <= 1, "
            f"got {t_range}."
        )
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
    params, static = eqx.partition(pred, eqx.is_inexact_array)
    dtype = _param_dtype(params)
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
    if opt_state is None:
        state = TrainState(
            params=params,
            opt_state=optimizer.init(params),
            # the moving average starts at zero and is bias-corrected at the end
            average=None if ema is None else jax.tree.map(jnp.zeros_like, params),
            step=0,
            key=key,
            ema=ema,
        )
    else:
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
        state = opt_state
    start = state.step
    end = start + steps
    chunk = min(chunk_size, steps, checkpoint_every or steps)
    split = None
    if mesh is not None:
        split = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    # "skip" decides at every step; "raise" checks the parameters and
    # optimiser state after each chunk, and a chunk that fails runs again
    # with the checks of every step to name the step
    config = (chunk, batch_size, t0, t1, ema, split, skip, skip)
    history = []
    done = 0
    skipped = 0

    if checkpoint_dir is not None:
        # before the first step, not at the first save a chunk later
        _writable_directory(checkpoint_dir, "checkpoint_dir")
        run = {
            "run": "retrax.diffusion.fit",
            "steps": steps,
            "start": start,
            "batch_size": batch_size,
            "t_range": [t0, t1],
            "ema": ema,
            "data": _fingerprint(data),
        }
        newest = _newest_intact(pathlib.Path(checkpoint_dir))
        if newest is not None:
            path, header, _ = newest
            for name, value in run.items():
                saved = header["metadata"].get(name)
                if saved != value:
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
            like = {"state": state, "losses": jnp.zeros(steps, data.dtype)}
            found = _restore(*newest, like)
            if not _same_key(found.tree["state"].key, key):
                raise ValueError(
                    f"the checkpoint {found.path} belongs to a run with another "
                    "`key`: pass the same key to resume, or another `checkpoint_dir`."
                )
            state = found.tree["state"]
            done = state.step - start
            if not 0 <= done <= steps:
                raise ValueError(
                    f"the checkpoint {found.path} is at step {state.step}, "
                    f"outside this run's steps {start} to {end}."
                )
            history.append(found.tree["losses"][:done])

    params, opt, average = state.params, state.opt_state, state.average
    if mesh is not None:
        data, run_key, params, opt, average = _replicate(
            (data, key, params, opt, average), mesh
        )
    else:
        run_key = key
    with tqdm(
        total=steps, initial=done, disable=not progress, desc="fit", unit="step"
    ) as bar:
        while done < steps:
            first = jnp.asarray(start + done, jnp.int32)
            n = min(chunk, steps - done)
            chunk_args = (
                static,
                optimizer,
                data,
                run_key,
                first,
                jnp.asarray(end, jnp.int32),
            )
            new = _train_chunk(params, opt, average, *chunk_args, config)
            losses, report = _local(new[3:], mesh)
            bad, why, skipped_here, state_bad = (int(v) for v in report)
            if (bad >= 0 or state_bad) and not skip:
                # the same steps again, each checking its update, to name the
                # first that failed
                per_step = config[:-1] + (True,)
                new = _train_chunk(params, opt, average, *chunk_args, per_step)
                losses, report = _local(new[3:], mesh)
                bad, why, _, _ = (int(v) for v in report)
                if bad < 0:  # not reproduced: name the chunk
                    bad, why = start + done + n - 1, 4
            params, opt, average = new[:3]
            history.append(losses[:n])
            skipped += skipped_here
            if bad >= 0 and not skip:
                saved = ""
                if checkpoint_dir is not None:
                    saved = f" The checkpoints in {checkpoint_dir} hold finite states."
                loss = float(losses[bad - start - done])
                raise FloatingPointError(
                    f"`fit` stopped at step {bad} (counting from 0 at the start of "
                    f"training): {_WHY[why]} (loss {loss:.6g}). A learning rate "
                    "too large, NaN or inf, or a schedule that grows, makes the "
                    f"run diverge. No update of a step from {bad} on was "
                    f"applied.{saved} Lower the learning rate, "
                    "or pass `nonfinite='skip'` to skip such steps."
                )
            previous, done = done, done + n
            if progress:
                bar.update(n)
                bar.set_postfix(loss=f"{float(jnp.mean(losses[:n])):.4g}")
            every = checkpoint_every or chunk
            if checkpoint_dir is not None and (
                done == steps or done // every > previous // every
            ):
                state = TrainState(params, opt, average, start + done, key, ema)
                so_far = jnp.concatenate(history)
                padded = jnp.zeros(steps, data.dtype).at[:done].set(so_far)
                _save(
                    checkpoint_dir,
                    start + done,
                    {"state": state, "losses": padded},
                    metadata=run,
                    keep=3,
                    finite_part=state,
                )
    if skipped:
        warnings.warn(
            f"`fit` skipped {skipped} of {steps} steps whose loss or update was not "
            "finite (`nonfinite='skip'`): their updates were not applied, and the "
            "parameters are those of the last finite step.",
            RuntimeWarning,
            # the call of `fit_solution` (for `fit`, its own call of it)
            stacklevel=2,
        )
    losses = jnp.concatenate(history)
    state = TrainState(params, opt, average, end, key, ema)
    if ema is not None:
        correction = 1.0 / (1.0 - ema**end)
        params = jax.tree.map(lambda a: (a * correction).astype(a.dtype), average)
    trained = eqx.combine(params, static)
    stats = {
        "num_steps": jnp.asarray(steps),
        "num_skipped": jnp.asarray(skipped),
    }
    return TrainSolution(trained, losses, state, RESULTS.successful, stats)
