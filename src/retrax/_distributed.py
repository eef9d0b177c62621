"""A batch split across the processes of `jax.distributed`.

Under JAX's multi-process runtime every process runs the same program and holds
only its own share of a batch. These helpers build the global array from the
shares (checking that the processes agree on what a share is) and cut a share
out of a batch that every process can compute. Both also work in a single
process, where the share is the whole batch.
"""

import json

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from jaxtyping import ArrayLike, PyTree, Shaped


def batch_mesh(axis_name: str = "batch") -> Mesh:
    """A one-axis mesh over every device of every process, in process order.

    The devices are ordered by process, then by their id within the process,
    so that the rows of a batch sharded along the axis are the processes'
    shares in process order (what [`retrax.shard_batch`][] builds). The axis
    is `jax.sharding.AxisType.Auto`, which `jit` propagates through every
    retrax function, including the loops and conditionals of the relation
    solvers (an `Explicit` axis is rejected inside their `lax.cond`).

    **Arguments:**

    - `axis_name`: the name of the mesh axis.

    **Returns:**

    A `jax.sharding.Mesh` of shape `(jax.device_count(),)`.
    """
    if not isinstance(axis_name, str):
        raise TypeError(f"`axis_name` must be a string, got {axis_name!r}.")
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    return Mesh(
        np.array(devices), (axis_name,), axis_types=(jax.sharding.AxisType.Auto,)
    )


def _rows(name: str, tree) -> tuple[list, int]:
    leaves = jax.tree.leaves(tree)
    if not leaves:
        raise ValueError(f"`{name}` holds no arrays.")
    arrays = []
    for leaf in leaves:
        if not isinstance(leaf, jax.Array | np.ndarray | np.generic | int | float):
            raise TypeError(
                f"`{name}` must hold arrays, got a leaf of type {type(leaf).__name__}."
            )
        arrays.append(np.asarray(leaf) if not isinstance(leaf, jax.Array) else leaf)
    sizes = {a.shape[0] if a.ndim else None for a in arrays}
    if None in sizes:
        raise ValueError(
            f"every array of `{name}` needs a leading batch axis; got a scalar."
        )
    if len(sizes) != 1:
        raise ValueError(
            f"the arrays of `{name}` must have the same number of rows (their "
            f"leading axis), got {sorted(sizes)}."
        )
    return arrays, sizes.pop()


def _same_on_every_process(name: str, description: list, what: str) -> None:
    """Raise unless `description` (JSON-serialisable) is equal on every process.

    A collective: every process must call it at the same point.
    """
    if jax.process_count() == 1:
        return
    text = json.dumps(description).encode()
    lengths = multihost_utils.process_allgather(np.asarray(len(text), np.int32))
    width = int(np.max(lengths))
    padded = np.zeros(width, np.uint8)
    padded[: len(text)] = np.frombuffer(text, np.uint8)
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    texts = [bytes(row[:n]).decode() for row, n in zip(gathered, lengths, strict=True)]
    if len(set(texts)) == 1:
        return
    held = "; ".join(f"process {i} holds {json.loads(t)}" for i, t in enumerate(texts))
    raise ValueError(
        f"`{name}` differs across processes ({held}): every process must hold {what}."
    )


def _replicate(tree: PyTree, mesh: Mesh) -> PyTree:
    """Every array of `tree` (the same on every process) replicated over `mesh`.

    `jax.device_put` accepts only shardings of this process's devices; a
    replicated global array is built from each process's own copy instead.
    """
    sharding = NamedSharding(mesh, PartitionSpec())

    def put(x):
        if not isinstance(x, jax.Array | np.ndarray):
            return x
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            impl = jax.random.key_impl(x)
            return jax.random.wrap_key_data(put(jax.random.key_data(x)), impl=impl)
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])

    return jax.tree.map(put, tree)


def _describe(tree, arrays) -> list:
    paths = [
        jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)
    ]
    return [
        [p or "batch", list(a.shape), str(a.dtype)]
        for p, a in zip(paths, arrays, strict=True)
    ]


def shard_batch(
    local_batch: PyTree[Shaped[ArrayLike, "..."]], mesh: Mesh | None = None
) -> PyTree[Shaped[jax.Array, "batch ..."]]:
    r"""The global batch whose rows are every process's `local_batch`, in process order.

    Each process passes its own share of the batch (e.g. from its own data
    loader), all of the same shape; the result is one global `jax.Array` per
    leaf, sharded along its leading axis over all the mesh's axes, of which
    this process holds (and computes on) only its rows. With $P$ processes
    each holding $n$ rows, the result has $Pn$ rows, process $p$'s at
    $[pn, (p + 1)n)$ with [`retrax.batch_mesh`][]. `jax.jit` of a vmapped
    retrax function (or its gradient) then runs each process's share where it
    lives and returns outputs split the same way; parameters passed alongside
    as ordinary arrays are replicated.

    This is `jax.make_array_from_process_local_data` with the checks a
    multi-process program needs: the shares must have the same shapes and
    dtypes on every process (checked with a collective, so every process must
    call it) and the local rows must split evenly over this process's
    devices. In one process it shards the batch over the local devices.

    **Arguments:**

    - `local_batch`: an array, or a pytree of arrays with the same number of
      rows, this process's share of the batch.
    - `mesh`: the device mesh to shard over (all its axes split the batch);
      `None` uses [`retrax.batch_mesh`][]`()`.

    **Returns:**

    A pytree like `local_batch` of global arrays with `jax.process_count()`
    times as many rows.
    """
    if mesh is None:
        mesh = batch_mesh()
    if not isinstance(mesh, Mesh):
        raise TypeError(f"`mesh` must be a jax.sharding.Mesh, got {mesh!r}.")
    arrays, rows = _rows("local_batch", local_batch)
    _same_on_every_process(
        "local_batch",
        _describe(local_batch, arrays),
        "a share of the same shapes and dtypes",
    )
    local_devices = len(mesh.local_devices)
    if local_devices == 0:
        raise ValueError(
            "`mesh` holds none of this process's devices: build it over "
            "`jax.devices()`, which lists every process's devices."
        )
    if rows % local_devices:
        raise ValueError(
            f"`local_batch` has {rows} rows, which do not split evenly over this "
            f"process's {local_devices} devices in `mesh`: pass a multiple of "
            f"{local_devices} rows."
        )
    sharding = NamedSharding(mesh, PartitionSpec(mesh.axis_names))
    leaves = jax.tree.map(
        lambda a: jax.make_array_from_process_local_data(sharding, a),
        jax.tree.unflatten(jax.tree.structure(local_batch), arrays),
    )
    return leaves


def process_share(
    batch: PyTree[Shaped[ArrayLike, "..."]],
) -> PyTree[Shaped[ArrayLike, "rows ..."]]:
    r"""This process's rows of a batch that every process holds whole.

    With $P$ processes (`jax.process_count()`) and a batch of $B$ rows,
    process $p$ gets rows $[pB/P, (p + 1)B/P)$ of every leaf: the share that
    [`retrax.shard_batch`][] expects, so that
    `shard_batch(process_share(batch))` is `batch` again, split across the
    processes. Use it when every process can compute the whole batch cheaply
    (the same seed, the same file); otherwise let each process load only its
    share. In one process it returns `batch`.

    **Arguments:**

    - `batch`: an array, or a pytree of arrays with the same number of rows.

    **Returns:**

    The same pytree, each leaf cut to this process's $B/P$ rows.
    """
    arrays, rows = _rows("batch", batch)
    count, index = jax.process_count(), jax.process_index()
    if rows % count:
        raise ValueError(
            f"`batch` has {rows} rows, which do not split evenly over "
            f"{count} processes: pass a multiple of {count} rows."
        )
    share = rows // count
    cut = [a[index * share : (index + 1) * share] for a in arrays]
    return jax.tree.unflatten(jax.tree.structure(batch), cut)
