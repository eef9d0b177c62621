"""The shape every solve and sampler returns: a result code, statistics, and
the `throw=` convention of optimistix and diffrax."""

from typing import TypeVar

import equinox as eqx
import jax
import jax.numpy as jnp
import optimistix as optx
from jaxtyping import Array, ArrayLike, Bool


class AbstractSolution(eqx.Module):
    """What a solve or a sampler returns.

    Every solution carries, besides its answer (whose fields each solution
    names for itself):

    - `result`: a result code, an `optx.RESULTS` (for the diffusion solves,
      [`retrax.diffusion.RESULTS`][], which extends it): `successful`, or why
      the answer is not one. Its message is `type(result)[result]`, e.g.
      `retrax.diffusion.RESULTS[sol.result]`. A solution without a natural
      failure reports `successful`, or its own codes (a non-finite answer).
    - `stats`: a dict of arrays about the run, e.g. `{"num_steps": ...}`;
      which keys each solution has is in its own docstring.

    and follows one convention, that of optimistix and diffrax: the function
    that returns it takes `throw: bool = True`. With `throw=True` a result
    other than `successful` (or other than the codes the function documents
    as answers, such as `unstable_root`) raises with the result's message,
    eagerly and under `jax.jit` alike (an `eqx.EquinoxRuntimeError`); with
    `throw=False` the solution is returned with its code, and an answer that
    is not one is never a silent number (NaN, or NaN derivatives, as each
    function documents).
    """

    result: eqx.AbstractVar[optx.RESULTS]
    stats: eqx.AbstractVar[dict[str, Array]]


_Solution = TypeVar("_Solution", bound=AbstractSolution)


def throw_if_failed(
    solution: _Solution,
    throw: bool,
    failed: Bool[ArrayLike, "*batch"] | None = None,
) -> _Solution:
    """The `throw=` convention: `solution`, carrying a check that raises its
    result's message when `throw` and `failed`.

    `failed` is `solution.result != successful` by default; a solve whose
    documented answers include other codes (`unstable_root`) passes its own.
    A batch of results (one per slot, shape `failed.shape`) raises with the
    first failed slot's message. The check is `result.error_if` (equinox's
    run-time error), so it holds eagerly, under `jit`, `vmap` and `grad`,
    and follows `EQX_ON_ERROR`; as with `eqx.error_if`, only the returned
    solution carries it.
    """
    if not throw:
        return solution
    result = solution.result
    if failed is None:
        failed = result != result._enumeration.successful
    failed = jnp.asarray(failed)
    if failed.ndim:
        first = jnp.argmax(failed.reshape(-1))
        result = jax.tree.map(lambda v: v.reshape(-1)[first], result)
        failed = jnp.any(failed)
    return result.error_if(solution, failed)
