"""The implicit adjoint of a query solve, with the solve's loop run in chunks
when the query is vmapped.

`optx.ImplicitAdjoint` differentiates a solve by the implicit function
theorem at its root, never through the loop; the loop itself is only ever
evaluated. Under `jax.vmap` that loop becomes one `while_loop` over the whole
batch: every lane runs until the slowest converges, and each step's field
evaluation holds the batch times the field's nodes in memory at once (1,024
queries of a K = 128 field: 131,072 network evaluations and their tangents a
step, arrays of tens of megabytes that no cache holds). Here the loop is a
`jax.custom_batching.custom_vmap` function whose batching rule runs it with
`lax.map(..., batch_size=chunk)`: a few queries at a time, each chunk's loop
ending with its own slowest query, the node evaluations of a chunk in cache.
Every query takes the same steps as it would alone, so answers, step counts
and result codes are those of the unchunked solve; the derivatives are
`optx.implicit_jvp`'s, exactly as `optx.ImplicitAdjoint` gives them.
"""

import functools as ft

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.tree_util as jtu
import lineax as lx
import optimistix as optx
import optimistix.internal as optxi
from jax import lax


def _chunked_primal(inputs):
    *inputs, primal_fn, chunk = inputs
    inputs = tuple(inputs)
    dynamic, static = eqx.partition(inputs, eqx.is_array)
    out_static = []

    def run(dyn):
        out = primal_fn(eqx.combine(dyn, static))
        out_dyn, out_stat = eqx.partition(out, eqx.is_array)
        if not out_static:
            out_static.append(out_stat)
        return out_dyn

    loop = jax.custom_batching.custom_vmap(run)

    @loop.def_vmap
    def _rule(axis_size, in_batched, dyn):
        (in_batched,) = in_batched
        batched, unbatched = eqx.partition(dyn, in_batched)

        def one(b):
            return run(eqx.combine(b, unbatched))

        out = lax.map(one, batched, batch_size=min(chunk, axis_size))
        return out, jtu.tree_map(lambda _: True, out)

    out_dyn = loop(dynamic)
    return eqx.combine(out_dyn, out_static[0])


# `optxi.implicit_jvp` takes global functions only; jaxtyping's import hook
# (the test suite's) wraps this one in a closure, as optimistix's `_iterate`.
if hasattr(_chunked_primal, "__wrapped__"):
    _chunked_primal = _chunked_primal.__wrapped__


class BatchedImplicitAdjoint(optx.AbstractAdjoint):
    """`optx.ImplicitAdjoint` whose solve loop runs `chunk` queries at a time
    under `jax.vmap` (see the module docstring)."""

    linear_solver: lx.AbstractLinearSolver
    chunk: int = eqx.field(static=True, default=16)

    def apply(self, primal_fn, rewrite_fn, inputs, tags):
        while_loop = ft.partial(eqxi.while_loop, kind="lax")
        inputs = inputs + (while_loop, primal_fn, self.chunk)
        return optxi.implicit_jvp(
            _chunked_primal, rewrite_fn, inputs, tags, self.linear_solver
        )
