"""Run-time checks that also hold inside `shard_map`."""

import functools
import inspect
import os
import re
from collections.abc import Callable, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import ArrayLike, Bool, PyTree


def varying_axes(x) -> frozenset:
    """The manual mesh axes (inside `shard_map`) that `x` varies over."""
    # `manual_axis_type.varying` in current JAX, `vma` in releases before it.
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", ()))


class InvalidArgumentError(ValueError, eqx.EquinoxRuntimeError):
    """A check of an argument's values failed outside a compiled program: on
    concrete input, or during an eager call of a function that retrax
    compiles as a whole (such as [`retrax.ops.allpole`][]).

    Both a `ValueError`, as scipy and Python raise for a bad value, and an
    `eqx.EquinoxRuntimeError`, what the same check raises at run time under
    `jax.jit`: code that catches either catches it. The message is the
    check's, which names the argument."""


def _nan_like(x: jax.Array) -> jax.Array:
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.full_like(x, jnp.nan)
    if x.dtype == jnp.bool_:
        return jnp.full_like(x, True)
    return jnp.full_like(x, np.iinfo(x.dtype).max)


def _raising() -> bool:
    # equinox's own switch for failed checks (read by equinox at import)
    return os.environ.get("EQX_ON_ERROR", "raise") == "raise"


def error_if(
    x: PyTree, pred: Bool[ArrayLike, "..."], msg: str, *, in_gradient: bool = False
) -> PyTree:
    """`eqx.error_if(x, pred, msg)`, without copying `x`, and also inside
    `shard_map`.

    `eqx.error_if` passes `x` through a `lax.cond`, whose result XLA writes
    to a new buffer: a copy of every checked array on every call, which for
    a batch of signals costs as much as the recursion that produced it. Here
    the check is made on a scalar flag instead (the same `eqx.error_if`,
    message and `EQX_ON_ERROR` modes) and each floating leaf of `x` is
    offset by the flag, zero unless the check failed: exact (`v - 0` is `v`),
    and fused by XLA into whatever reads the result next.
    `EQX_ON_ERROR=nan` makes the flag NaN, so `x` becomes NaN as it would
    with `eqx.error_if`; other leaves (integers, booleans, and weakly typed
    scalars, whose type the arithmetic would make strong) take the error value
    through `jnp.where`.

    With `in_gradient`, each floating leaf is multiplied by `1 - flag`
    instead (a complex leaf part by part; exact too), so that the check
    also survives `jax.grad` when nothing reads the checked value's primal:
    the derivative with respect to `x` is `1 - flag`, which the backward
    pass reads. With `v - flag`, a gradient that needs only the cotangent of
    `x` (a loss linear in an op's output, a gradient with respect to FIR
    taps) lets XLA drop the check with the unused forward value. Only for
    checks that must survive such gradients (coefficients): a product
    changes how XLA compiles what reads the value, and two signals checked
    this way no longer compile alike (the STFT losses' gradient at equal
    signals was then not exactly zero).

    Inside `shard_map`, when `pred` differs per device, it is first combined
    over the devices (`lax.pmax`), so that every device raises, not only the
    one whose values are bad: the others would otherwise wait forever for it
    in the program's next collective. The flag is invariant, so the check's
    `lax.cond` types the same whether or not `x` varies over the devices.

    A `pred` that is not traced is decided at once: `InvalidArgumentError`
    (a `ValueError`) with `msg` if it holds, as Python and scipy raise for a
    bad value, unless `EQX_ON_ERROR` asks for something other than raising.

    As with `eqx.error_if`, only the returned value carries the check.
    """
    return errors_if(x, (pred,), (msg,), in_gradient=in_gradient)


def errors_if(
    x: PyTree,
    preds: Sequence[Bool[ArrayLike, "..."]],
    msgs: Sequence[str],
    *,
    in_gradient: bool = False,
) -> PyTree:
    """`error_if` for several checks of one value, staged as one: it raises
    `msgs[i]` for the first `preds[i]` (in order) that holds.

    Each `error_if` under `jit` is its own host callback and `cond` in the
    compiled program; checks made together (the arguments of one call) cost
    one here. Under `jax.vmap` (and inside `shard_map`) the first check that
    fails for any member of the batch gives the message, as the first of
    separate `error_if` calls would.
    """
    if len(preds) != len(msgs) or not preds:
        raise ValueError("errors_if: give one message per check, and at least one.")
    # (the cheapest tests first: every eager call's host checks pay for them)
    if (
        type(x) is not np.ndarray
        and not isinstance(x, jax.Array)
        and not any(eqx.is_array(v) for v in jax.tree.leaves(x))
    ):
        raise ValueError("error_if: `x` has no arrays to carry the check.")
    if not any(isinstance(p, jax.core.Tracer) for p in preds) and _raising():
        for pred, msg in zip(preds, msgs, strict=True):
            if pred if type(pred) is bool else np.asarray(pred).any():
                raise InvalidArgumentError(msg)
        return x
    if len(preds) == 1:
        (pred,), index, msgs = preds, 0, list(msgs)
        axes = tuple(sorted(varying_axes(pred)))
        if axes:
            pred = lax.pmax(jnp.any(pred).astype(jnp.int32), axes) > 0
    else:
        # The checks in reverse, so that the largest index over a batch (the
        # one equinox reports) is that of the earliest check that failed.
        last = len(preds) - 1
        flags = [jnp.any(p) for p in preds]
        index = jnp.zeros((), jnp.int32)
        for i in reversed(range(len(flags))):
            index = jnp.where(flags[i], last - i, index)
        pred = functools.reduce(jnp.logical_or, flags)
        msgs = list(reversed(msgs))
        axes = tuple(sorted(set().union(*(varying_axes(f) for f in flags))))
        if axes:
            pred = lax.pmax(pred.astype(jnp.int32), axes) > 0
            index = lax.pmax(index, axes)
    zero = jnp.zeros(())
    flag = eqx.branched_error_if(zero, pred, index, msgs)
    if flag is zero:  # `pred` was known to be false when tracing
        return x
    bad = jnp.isnan(flag)  # only when EQX_ON_ERROR turned the flag to NaN
    one = 1 - flag  # 1 unless the check failed (see `error_if`)

    def apply(v):
        if not eqx.is_array(v):
            return v
        strong = not jax.typeof(v).weak_type
        if jnp.issubdtype(v.dtype, jnp.inexact) and strong and not in_gradient:
            return v - flag.astype(v.dtype)
        if jnp.issubdtype(v.dtype, jnp.floating) and strong:
            return v * one.astype(v.dtype)
        if jnp.issubdtype(v.dtype, jnp.complexfloating) and strong:
            # each part by the real factor: a complex product by `1 + 0j`
            # would make `inf * 0` a NaN in the other part
            s = one.astype(v.real.dtype)
            return lax.complex(v.real * s, v.imag * s)
        return jnp.where(bad, _nan_like(v), v)  # keeps a weak type weak

    return jax.tree.map(apply, x)


# The one place that reads equinox's rendering of a failed run-time check
# (pinned against the installed equinox by tests/project/test_filter_jit.py).
# Under `eqx.filter_jit`: a header, the stack that was current when the
# program was traced (the first call that compiled it, not necessarily the
# one that failed), then `equinox.EquinoxRuntimeError: <message>`, a line of
# dashes and general advice. Under `jax.jit`: JAX's callback traceback, then
# `_EquinoxRuntimeError: <message>`, a line of dashes and advice.
_EQX_MESSAGE = "equinox.EquinoxRuntimeError: "
_EQX_HEADER = "Above is the stack outside of JIT. Below is the stack inside of JIT:\n"
_CHECK = re.compile(r"EquinoxRuntimeError: (.*?)\n\n+-{8,}\n", re.DOTALL)


def check_message(text: str) -> str | None:
    """The failed check's own message in equinox's rendering of it (under
    `eqx.filter_jit` or `jax.jit`), or `None` if `text` renders none."""
    found = _CHECK.search(text)
    return found.group(1).strip() if found else None


def _result_messages() -> frozenset[str]:
    """The messages of every result code a solve can fail with: optimistix's
    `RESULTS` (lineax's among them) and each extension of it imported so
    far, such as retrax's own. (Equinox keeps an enumeration's messages in
    `_index_to_message`; this is the one place that reads it.)"""
    import optimistix as optx  # only on a failure: `retrax.ops` does not load it

    found: set[str] = set()
    todo = [optx.RESULTS]
    while todo:
        enumeration = todo.pop()
        todo.extend(enumeration.__subclasses__())
        found.update(m.strip() for m in enumeration._index_to_message if m)
    return frozenset(found)


def is_argument_check(msg: str) -> bool:
    """Whether a failed check's message is an argument's (a bad value), not
    a failed solve's result code."""
    return msg not in _result_messages()


def _frames(stack: str) -> list[str]:
    frames: list[str] = []
    for line in stack.splitlines(keepends=True):
        if line.startswith('  File "') or not frames:
            frames.append(line)
        else:
            frames[-1] += line
    return frames


def _inside(stack: str, fn: Callable | None = None) -> str:
    """The frames of a traced stack below `filter_jit`'s own call, without
    this module's: where in the compiled function the check was made. The
    frames above are those of whichever call traced the program first.

    Equinox records the stack once per distinct check (its message, or the
    whole set of a result code's messages, and the shapes it guards), when
    it is first traced, and reuses it for every later program making the
    same check: a stack whose first frame is not `fn`'s was recorded inside
    another function, and is left out (`""`) rather than shown as this
    check's place."""
    frames = _frames(stack)
    this = f'"{__file__}"'
    calls = [i for i, f in enumerate(frames) if this in f and ", in __call__" in f]
    if calls:
        frames = frames[calls[-1] + 1 :]
    frames = [f for f in frames if this not in f]
    if fn is not None:
        code = getattr(inspect.unwrap(fn), "__code__", None)
        first = frames[0] if frames else ""
        if code is None or not first.startswith(f'  File "{code.co_filename}", line '):
            return ""
        if not first.split("\n", 1)[0].endswith(f", in {code.co_name}"):
            return ""
    return "".join(frames)


def lead_with_check(text: str, fn: Callable | None = None) -> str:
    """`eqx.filter_jit`'s rendering of a failed check, reordered so that the
    check's own message comes first and where it sits after it (when that
    place lies in `fn`, the compiled function; see `_inside`)."""
    found = _CHECK.search(text)
    if found is None or _EQX_MESSAGE not in text:
        return text
    head, advice = text[: found.start()], text[found.end() :]
    head = head.removesuffix("equinox.")
    stack = _inside(head.removeprefix(_EQX_HEADER), fn).strip("\n")
    parts = [found.group(1).strip()]
    if stack:
        parts.append("The check, inside the compiled call:\n" + stack)
    if advice:
        parts.append(advice.strip())
    return "\n\n".join(parts) + "\n"


def filter_jit(fn: Callable | None = None, **jit_kwargs) -> Callable:
    """`eqx.filter_jit`, whose failed run-time checks lead with the check's
    message.

    A drop-in for `eqx.filter_jit` (the same arguments: `donate=...`; usable
    as `@retrax.filter_jit` or `@retrax.filter_jit(donate="all")`) for your
    own compiled programs that call retrax. When a run-time check fails
    inside it, for instance a NaN coefficient reaching
    [`retrax.ops.lfilter`][] under `jit`, Equinox renders the error with
    the stack of the call that first traced the program before the
    message. This wrapper raises the same `eqx.EquinoxRuntimeError` with
    the check's message (which names the argument) first, then where the
    check sits inside the compiled function, then Equinox's advice. The
    arguments of such a call are concrete values, so a failed check of an
    argument raises as a [`retrax.InvalidArgumentError`][], both a
    `ValueError` (as Python and scipy raise for a bad value) and an
    `eqx.EquinoxRuntimeError`; a failed solve's result code (`throw=True`)
    stays an `eqx.EquinoxRuntimeError`.

    Only the outermost compiled call raises: wrap the outermost one. Under a
    plain `jax.jit`, JAX raises a `JaxRuntimeError` whose text contains the
    message after a traceback; no wrapper can reorder that.

    **Arguments:**

    - `fn`: the function to compile, with the non-array arguments static
      (as `eqx.filter_jit` treats them).
    - `jit_kwargs`: passed to `eqx.filter_jit`.

    **Returns:**

    The compiled function; its `lower` is `eqx.filter_jit`'s.
    """
    if fn is None:
        return functools.partial(filter_jit, **jit_kwargs)
    return _FilterJit(fn, eqx.filter_jit(fn, **jit_kwargs))


class _FilterJit:
    """`filter_jit(fn)`: called like `fn`, with `lower` (`eqx.filter_jit`'s)
    as a method. A method, not an attribute: `jax.vmap` and `jax.jit` copy a
    wrapped function's attributes onto their wrapper, so an attribute
    `lower` would make `jax.jit(jax.vmap(f)).lower` lower the unbatched `f`."""

    def __init__(self, fn: Callable, jitted: Callable):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._jitted = jitted

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        try:
            return self._jitted(*args, **kwargs)
        except eqx.EquinoxRuntimeError as error:
            # an eager call: its arguments are concrete, so a failed argument
            # check is a bad value, raised as Python and scipy raise one
            text = str(error)
            msg = check_message(text)
            bad_value = msg is not None and is_argument_check(msg)
            kind = InvalidArgumentError if bad_value else eqx.EquinoxRuntimeError
            raise kind(lead_with_check(text, self._fn)) from None

    def lower(self, *args, **kwargs):
        """`eqx.filter_jit`'s `lower` (ahead-of-time compilation)."""
        return self._jitted.lower(*args, **kwargs)
