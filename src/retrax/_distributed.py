"""A batch split across the processes of `jax.distributed`.

Under JAX's multi-process runtime every process runs the same program and holds
only its own share of a batch. These helpers build the global array from the
shares (checking that the processes agree on what a share is) and cut a share
out of a batch that every process can compute. Both also work in a single
process, where the share is the whole batch.
"""

import dataclasses
import functools
import hashlib
import json
import types
from typing import Any

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


def _gather_texts(text: str) -> list[str]:
    """Every process's `text`, in process order (a collective)."""
    raw = text.encode()
    lengths = multihost_utils.process_allgather(np.asarray(len(raw), np.int32))
    width = max(int(np.max(lengths)), 1)
    padded = np.zeros(width, np.uint8)
    padded[: len(raw)] = np.frombuffer(raw, np.uint8)
    gathered = np.asarray(multihost_utils.process_allgather(padded))
    return [bytes(row[:n]).decode() for row, n in zip(gathered, lengths, strict=True)]


def _same_on_every_process(name: str, description: list, what: str) -> None:
    """Raise unless `description` (JSON-serialisable) is equal on every process.

    A collective: every process must call it at the same point.
    """
    if jax.process_count() == 1:
        return
    texts = _gather_texts(json.dumps(description))
    if len(set(texts)) == 1:
        return
    held = "; ".join(f"process {i} holds {json.loads(t)}" for i, t in enumerate(texts))
    raise ValueError(
        f"`{name}` differs across processes ({held}): every process must hold {what}."
    )


_MAX_ENTRIES = 4096
_MAX_DEPTH = 24


def _array_text(x) -> str:
    if isinstance(x, jax.Array):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            return "key " + _array_text(jax.random.key_data(x))
        if not x.is_fully_addressable:
            if not x.is_fully_replicated:
                return f"{x.shape} {x.dtype} (sharded, not compared)"
            x = x.addressable_data(0)
    host = np.ascontiguousarray(np.asarray(x))
    if host.size <= 4:
        return f"{host.dtype} {host.tolist()!r}"
    digest = hashlib.sha256(host).hexdigest()[:16]
    return f"{host.shape} {host.dtype} sha256:{digest}"


def _walk(obj, path: str, out: dict, depth: int, stack: frozenset) -> None:
    """Flatten what `obj` holds into `out` (path -> text): numbers and arrays,
    the code and closed-over values of functions, the fields of modules."""
    if len(out) >= _MAX_ENTRIES:
        return
    if obj is None or isinstance(obj, bool | int | float | complex | str | bytes):
        out[path] = repr(obj)
        return
    if isinstance(obj, jax.Array | np.ndarray | np.generic):
        out[path] = _array_text(obj)
        return
    if depth >= _MAX_DEPTH or id(obj) in stack:
        out[path] = f"<{type(obj).__qualname__}>"
        return
    stack = stack | {id(obj)}
    walk = lambda value, sub: _walk(value, path + sub, out, depth + 1, stack)
    if isinstance(obj, dict):
        out[path] = f"{type(obj).__qualname__} of {len(obj)}"
        for k in sorted(obj, key=repr):
            walk(obj[k], f"[{k!r}]")
    elif isinstance(obj, tuple | list):
        out[path] = f"{type(obj).__qualname__} of {len(obj)}"
        names = getattr(obj, "_fields", None)
        for i, v in enumerate(obj):
            walk(v, f".{names[i]}" if names else f"[{i}]")
    elif isinstance(obj, functools.partial):
        out[path] = "partial"
        walk(obj.func, ".func")
        walk(obj.args, ".args")
        walk(obj.keywords, ".keywords")
    elif isinstance(obj, types.MethodType):
        walk(obj.__func__, ".__func__")
        walk(obj.__self__, ".__self__")
    elif isinstance(obj, types.FunctionType):
        out[path] = f"{obj.__module__}.{obj.__qualname__}"
        code = obj.__code__
        for name, cell in zip(code.co_freevars, obj.__closure__ or (), strict=True):
            try:
                value = cell.cell_contents
            except ValueError:  # a cell not yet filled
                continue
            walk(value, f".{name}")
        walk(obj.__defaults__, ".__defaults__")
        walk(obj.__kwdefaults__, ".__kwdefaults__")
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out[path] = type(obj).__qualname__
        for field in dataclasses.fields(obj):
            walk(getattr(obj, field.name, None), f".{field.name}")
    else:
        name = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
        out[path] = f"<{type(obj).__qualname__} {name}>".replace(" >", ">")


def _describe_value(value) -> dict:
    """`value` as a flat dictionary of texts that two processes can compare."""
    out: dict = {}
    try:
        _walk(value, "", out, 0, frozenset())
    except Exception as err:  # describing must never raise on one process only
        out = {"": f"<unreadable {type(value).__qualname__}: {err}>"}
    return out


def _same_arguments(arguments: dict[str, Any], what: str) -> None:
    """Raise on every process unless each argument agrees on every process.

    A collective, made once before a multi-process computation: each
    argument (numbers, arrays by their SHA-256, functions by their code and
    closed-over values, e.g. an optimiser's learning rate) is described,
    the descriptions are gathered, and the first argument that differs is
    named with what each process holds. Every process reaches the same
    verdict, so none is left waiting in a later collective.
    """
    if jax.process_count() == 1:
        return
    described = {name: _describe_value(v) for name, v in arguments.items()}
    texts = _gather_texts(json.dumps(described))
    if len(set(texts)) == 1:
        return
    held = [json.loads(t) for t in texts]
    for name in arguments:
        views = [h.get(name, {}) for h in held]
        if all(v == views[0] for v in views):
            continue
        paths = sorted({p for v in views for p in v})
        differ = [p for p in paths if len({v.get(p) for v in views}) > 1][:4]

        def show(view, name=name, differ=differ):
            return ", ".join(f"{name}{p}={view.get(p, '(nothing)')}" for p in differ)

        told = "; ".join(f"process {i} holds {show(v)}" for i, v in enumerate(views))
        raise ValueError(
            f"`{name}` differs across processes ({told}): every process must {what}."
        )
    raise ValueError(
        f"the arguments differ across processes: every process must {what}."
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
