"""The pieces that one structure of the recurrence primitive supplies.

`_linear_primitive.linear_p` runs the all-pole, diagonal and dense linear
recursions as one primitive with the structure a static parameter. Its
rules (abstract evaluation, impl, lowering, batching, JVP, transpose) are
written once; what differs between structures is a `Structure`, defined
beside its math (`_allpole_structure.ALLPOLE`,
`_state_structures.DIAGONAL` and `DENSE`).
"""

import dataclasses
from collections.abc import Callable

from ._kernel_lowering import Kernel


@dataclasses.dataclass(frozen=True)
class Structure:
    """One structure of the recurrence primitive.

    **Fields:**

    - `name`: the binder's name, for error messages.
    - `signal_rank`: the rank of one signal `u` (and of the output); the
      state `zi` has rank 1.
    - `step_rank`: the rank of one step's coefficients (constant ones have
      this rank, per-sample ones one more, before any batch axis).
    - `scan`: `scan(a, u, zi, *, adjoint, unroll)`, the recursion as XLA
      operations (one signal, or a batch in front).
    - `kernel`: the compiled CPU kernel (`Kernel.call` takes the primitive's
      parameters `structure`, `adjoint` and `unroll`).
    - `coefficient_drive`: `coefficient_drive(da, out, zi, adjoint)`, the
      tangent's drive from the coefficients' tangent `da`.
    - `state_cotangent`: `state_cotangent(a, ct_u, zeros, *, adjoint,
      per_sample)`, the state's cotangent from the transposed recursion's
      output `ct_u` (`zeros`: a zero state).
    - `cpu_scan`: the CPU's scan where it differs from `scan`.
    """

    name: str
    signal_rank: int
    step_rank: int
    scan: Callable
    kernel: Kernel
    coefficient_drive: Callable
    state_cotangent: Callable
    cpu_scan: Callable | None = None

    def per_sample(self, a, u) -> bool:
        """Whether `a` holds one step's coefficients per sample of `u`."""
        return a.ndim == u.ndim - self.signal_rank + self.step_rank + 1
