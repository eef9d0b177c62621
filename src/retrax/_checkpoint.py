"""Checkpoints: a pytree on disk, written atomically and read only when intact.

A checkpoint file is

    MAGIC | 8-byte little-endian header length | JSON header | payload | SHA-256

where the payload is `equinox.tree_serialise_leaves` of the tree, the header
records the step, the payload's length, the path, shape and dtype of every
leaf and the caller's metadata, and the last 32 bytes are the SHA-256 digest
of everything before them. A file cut short or damaged anywhere fails the
digest and is never deserialised. Files are written to a temporary name in the
same directory, flushed and `fsync`ed, then renamed over the final name
(`os.replace` is atomic on POSIX and Windows), and the directory is `fsync`ed
so that the rename itself survives a power cut.
"""

import hashlib
import io
import json
import os
import pathlib
import re
import struct
import tempfile
import warnings
from typing import NamedTuple

import equinox as eqx
import jax
import numpy as np
from jaxtyping import PyTree


_MAGIC = b"RETRAX-CHECKPOINT-1\n"
_DIGEST = 32
_NAME = re.compile(r"^checkpoint-(\d+)\.ckpt$")


class Checkpoint(NamedTuple):
    """A checkpoint read back by [`retrax.load_checkpoint`][].

    **Fields:**

    - `step`: the step it was saved at.
    - `tree`: the saved pytree, with the structure of the `like` it was read
      into.
    - `metadata`: the JSON-serialisable dictionary saved with it (empty if
      none was).
    - `path`: the file it was read from.
    """

    step: int
    tree: PyTree
    metadata: dict
    path: pathlib.Path


def _is_key(x) -> bool:
    return isinstance(x, jax.Array | jax.ShapeDtypeStruct) and jax.dtypes.issubdtype(
        x.dtype, jax.dtypes.prng_key
    )


def _leaf_signature(path, leaf) -> list:
    name = jax.tree_util.keystr(path)
    if isinstance(leaf, jax.Array | np.ndarray | np.generic | jax.ShapeDtypeStruct):
        return [name, list(leaf.shape), str(leaf.dtype)]
    return [name, type(leaf).__name__]


def _signature(tree) -> list:
    return [_leaf_signature(p, x) for p, x in jax.tree_util.tree_leaves_with_path(tree)]


def _serialise_leaf(f, x) -> None:
    # key arrays have no NumPy dtype: store their raw data
    if _is_key(x):
        x = jax.random.key_data(x)
    eqx.default_serialise_filter_spec(f, x)


def _key_data_like(x):
    if not _is_key(x):
        return x
    if isinstance(x, jax.Array):
        return jax.random.key_data(x)
    return jax.eval_shape(jax.random.key_data, x)


def _rewrap_key(new, old):
    if not _is_key(old):
        return new
    # a ShapeDtypeStruct carries its key implementation on its dtype only
    impl = jax.random.key_impl(old) if isinstance(old, jax.Array) else old.dtype._impl
    return jax.random.wrap_key_data(new, impl=impl)


def _check_directory(directory) -> pathlib.Path:
    if not isinstance(directory, str | os.PathLike):
        raise TypeError(
            f"`directory` must be a path (str or os.PathLike), got {directory!r}."
        )
    return pathlib.Path(directory)


def _check_step(step) -> int:
    if isinstance(step, bool) or not isinstance(step, int | np.integer):
        raise TypeError(f"`step` must be a non-negative integer, got {step!r}.")
    if step < 0:
        raise ValueError(f"`step` must be a non-negative integer, got {step!r}.")
    return int(step)


def _checkpoint_files(directory: pathlib.Path) -> list[tuple[int, pathlib.Path]]:
    """The checkpoint files in `directory`, newest (largest step) first."""
    if not directory.exists():
        return []
    if not directory.is_dir():
        raise ValueError(
            f"`directory` must be a directory of checkpoints, but {directory} is a "
            "file."
        )
    found = []
    for entry in directory.iterdir():
        match = _NAME.match(entry.name)
        if match is not None and entry.is_file():
            found.append((int(match.group(1)), entry))
    return sorted(found, key=lambda item: item[0], reverse=True)


def _writable_directory(directory, name: str) -> pathlib.Path:
    """Create `directory` if missing and prove it writable with a probe file.

    Raises a `ValueError` naming the argument `name` when it cannot be
    created, is not a directory, or a file cannot be written, flushed and
    removed there: found before a run's first step, not at its first save.
    """
    path = pathlib.Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", suffix=".tmp", dir=path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(b"retrax")
                f.flush()
                os.fsync(f.fileno())
        finally:
            pathlib.Path(probe).unlink(missing_ok=True)
    except OSError as err:
        raise ValueError(
            f"`{name}` ({str(directory)!r}) is not a writable directory: {err}. "
            "Pass a directory that can be created and written to."
        ) from err
    return path


def _all_finite(tree) -> bool:
    """Whether every floating-point array of `tree` is finite (on the host)."""
    for leaf in jax.tree.leaves(tree):
        if _is_key(leaf):
            continue
        if isinstance(leaf, jax.Array | np.ndarray | np.generic | float | complex):
            host = np.asarray(leaf)
            if np.issubdtype(host.dtype, np.inexact) and not np.all(np.isfinite(host)):
                return False
    return True


def _holds_finite(path: pathlib.Path, step: int) -> bool:
    """Whether the checkpoint at `path` is intact and holds finite arrays.

    Files written before the flag existed count as finite.
    """
    try:
        header, _ = _read(path, step)
    except _Corrupt:
        return False
    return bool(header.get("finite", True))


def _fsync_directory(directory: pathlib.Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # Windows cannot open a directory; its rename is durable
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(
    directory: str | os.PathLike,
    step: int,
    tree: PyTree,
    *,
    metadata: dict | None = None,
    keep: int | None = None,
) -> pathlib.Path:
    """Write `tree` to `directory/checkpoint-<step>.ckpt`, atomically.

    The arrays of `tree` (JAX and NumPy arrays, PRNG keys, Python numbers) are
    stored with `equinox.tree_serialise_leaves`; its other leaves (functions,
    strings) are not stored and come back from the `like` given to
    [`retrax.load_checkpoint`][]. The file is written under a
    temporary name in `directory`, `fsync`ed and renamed, so a process killed
    at any moment leaves either the previous checkpoints or the new one, never
    a partial file under a checkpoint's name. Each file ends with a SHA-256
    digest of its contents, so damage after the write is detected when it is
    read. A killed writer may leave a `.checkpoint-*.tmp` file behind; it is
    never read and can be deleted.

    !!! example

        A checkpointed optax loop that resumes where it was killed:

        ```python
        params = ...  # initial parameters
        opt = optax.adam(1e-3)
        state = (params, opt.init(params))
        start = 0
        found = retrax.load_checkpoint("ckpts", like=state)
        if found is not None:
            start, state = found.step, found.tree
        for step in range(start, 1000):
            params, opt_state = state
            grads = jax.grad(loss)(params, jax.random.fold_in(key, step))
            updates, opt_state = opt.update(grads, opt_state, params)
            state = (optax.apply_updates(params, updates), opt_state)
            if (step + 1) % 100 == 0:
                retrax.save_checkpoint("ckpts", step + 1, state, keep=3)
        ```

        Draw the randomness of step `s` from `jax.random.fold_in(key, s)` (or
        save the key in the tree): a resumed run then takes the same steps as
        an uninterrupted one.

    **Arguments:**

    - `directory`: where to write; created if missing.
    - `step`: a non-negative integer, the step the state is at (it names the
      file: `checkpoint-000000100.ckpt`).
    - `tree`: the pytree to save.
    - `metadata`: a JSON-serialisable dictionary saved alongside (e.g. the
      settings of the run, to check when resuming).
    - `keep`: keep only the newest `keep` checkpoints in `directory` (counting
      this one), deleting older ones after this one is safely written; `None`
      (the default) keeps all. The rotation never removes the last finite
      state: when this checkpoint and the other survivors all hold a NaN or
      inf in a floating-point array (a diverged run), the newest intact
      checkpoint whose arrays are all finite is kept as well.

    **Returns:**

    The path of the written file.
    """
    return _save(directory, step, tree, metadata=metadata, keep=keep, finite_part=tree)


def _save(directory, step, tree, *, metadata, keep, finite_part) -> pathlib.Path:
    """`save_checkpoint`, with the rotation's notion of a finite state read
    from `finite_part` (a part of `tree`, e.g. a training state without its
    loss history)."""
    directory = _check_directory(directory)
    step = _check_step(step)
    if keep is not None and (
        isinstance(keep, bool) or not isinstance(keep, int) or keep < 1
    ):
        raise ValueError(f"`keep` must be a positive integer or None, got {keep!r}.")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise TypeError(f"`metadata` must be a dict, got {type(metadata).__name__}.")
    finite = _all_finite(finite_part)
    payload = io.BytesIO()
    eqx.tree_serialise_leaves(payload, tree, filter_spec=_serialise_leaf)
    payload = payload.getvalue()
    try:
        header = json.dumps(
            {
                "step": step,
                "payload_bytes": len(payload),
                "leaves": _signature(tree),
                "metadata": metadata,
                "finite": finite,
            }
        ).encode()
    except TypeError as err:
        raise TypeError(f"`metadata` must be JSON-serialisable: {err}") from err
    body = _MAGIC + struct.pack("<Q", len(header)) + header + payload
    body += hashlib.sha256(body).digest()

    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"checkpoint-{step:09d}.ckpt"
    fd, tmp = tempfile.mkstemp(prefix=f".{final.stem}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_directory(directory)

    if keep is not None:
        older = [(s, p) for s, p in _checkpoint_files(directory) if s < step]
        survivors, doomed = older[: keep - 1], older[keep - 1 :]
        if doomed and not finite and not any(_holds_finite(p, s) for s, p in survivors):
            # a diverged run must not rotate away its last good state
            last_good = next(((s, p) for s, p in doomed if _holds_finite(p, s)), None)
            if last_good is not None:
                doomed.remove(last_good)
        for _, path in doomed:
            path.unlink(missing_ok=True)
    return final


class _Corrupt(Exception):
    pass


def _read(path: pathlib.Path, step: int) -> tuple[dict, bytes]:
    """The header and payload of the file at `path`, or `_Corrupt` saying why."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise _Corrupt(f"cannot be read ({err})") from err
    if not raw.startswith(_MAGIC):
        raise _Corrupt("is not a retrax checkpoint (wrong leading bytes)")
    if len(raw) < len(_MAGIC) + 8 + _DIGEST:
        raise _Corrupt(f"is truncated ({len(raw)} bytes)")
    body, digest = raw[:-_DIGEST], raw[-_DIGEST:]
    if hashlib.sha256(body).digest() != digest:
        raise _Corrupt(
            f"fails its SHA-256 check ({len(raw)} bytes: truncated or damaged)"
        )
    (n,) = struct.unpack("<Q", body[len(_MAGIC) : len(_MAGIC) + 8])
    start = len(_MAGIC) + 8
    try:
        header = json.loads(body[start : start + n])
    except ValueError as err:
        raise _Corrupt(f"has an unreadable header ({err})") from err
    payload = body[start + n :]
    if header.get("payload_bytes") != len(payload) or header.get("step") != step:
        raise _Corrupt("has a header that does not match its name or its length")
    return header, payload


def _signature_mismatch(got: list, want: list) -> str | None:
    """How two leaf signatures (`_signature`) differ, or `None` if they agree."""
    if got == want:
        return None
    got = [tuple(map(str, s)) for s in got]
    want = [tuple(map(str, s)) for s in want]
    if len(got) != len(want):
        return f"{len(got)} leaves where {len(want)} are expected"
    g, w = next((g, w) for g, w in zip(got, want, strict=True) if g != w)
    return f"{' '.join(g)} where {' '.join(w)} is expected"


def _check_structure(path: pathlib.Path, saved: list, like) -> None:
    detail = _signature_mismatch(saved, _signature(like))
    if detail is None:
        return
    raise ValueError(
        f"the checkpoint {path} was written for a different structure than "
        f"`like` (a different model, optimiser or dtype): it holds {detail} by "
        "`like`. Point "
        "`directory` at this run's own checkpoints."
    )


def _newest_intact(directory: pathlib.Path) -> tuple | None:
    """`(path, header, payload)` of the newest intact checkpoint in `directory`."""
    files = _checkpoint_files(directory)
    if not files:
        return None
    for step, path in files:
        try:
            header, payload = _read(path, step)
        except _Corrupt as why:
            warnings.warn(
                f"the checkpoint {path} {why}; it is skipped and the previous "
                "checkpoint is used.",
                RuntimeWarning,
                stacklevel=3,
            )
            continue
        return path, header, payload
    names = ", ".join(p.name for _, p in files)
    raise ValueError(
        f"no intact checkpoint in {directory}: every checkpoint there ({names}) is "
        "truncated or damaged. Delete them to start the run afresh."
    )


def _restore(path: pathlib.Path, header: dict, payload: bytes, like) -> Checkpoint:
    _check_structure(path, header["leaves"], like)
    # keys are read as their raw data (equinox would refuse a key array read
    # into a ShapeDtypeStruct), then wrapped again
    tree = eqx.tree_deserialise_leaves(
        io.BytesIO(payload), jax.tree.map(_key_data_like, like)
    )
    tree = jax.tree.map(_rewrap_key, tree, like)
    return Checkpoint(header["step"], tree, header["metadata"], path)


def load_checkpoint(directory: str | os.PathLike, like: PyTree) -> Checkpoint | None:
    """Read the newest intact checkpoint in `directory`.

    Checkpoints are tried newest (largest step) first. One that fails its
    integrity check (cut short, damaged, not a checkpoint) is never
    deserialised: a `RuntimeWarning` names the file and the previous one is
    tried. A checkpoint whose leaves (paths, shapes, dtypes) differ from those
    of `like` raises a `ValueError`: it belongs to a different model or run.

    See [`retrax.save_checkpoint`][] for an example.

    **Arguments:**

    - `directory`: the directory passed to `save_checkpoint`.
    - `like`: a pytree with the structure of the saved one (e.g. the freshly
      initialised state; `jax.ShapeDtypeStruct` leaves also do). Its leaves
      that are not arrays or Python numbers are returned as they are.

    **Returns:**

    A [`retrax.Checkpoint`][] `(step, tree, metadata, path)`, or
    `None` when `directory` holds no checkpoint (or does not exist).

    **Raises:**

    `ValueError` when checkpoints exist but none is intact, or the newest
    intact one does not match `like`.
    """
    directory = _check_directory(directory)
    found = _newest_intact(directory)
    return None if found is None else _restore(*found, like)
