"""The pieces that one structure of the recurrence primitive supplies.

`_linear_primitive.linear_p` runs the all-pole, diagonal and dense linear
recursions and cascades of second-order sections as one primitive with the
structure a static parameter. Its rules (abstract evaluation, impl,
lowering, batching, JVP, transpose) are written once; what differs between
structures is a `Structure`, defined beside its math
(`_allpole_structure.ALLPOLE`, `_state_structures.DIAGONAL` and `DENSE`,
`_sections_structure.SECTIONS` and `SECTIONS_STATE`).
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
    - `kernel`: the compiled CPU kernel (`Kernel.call` takes the primitive's
      parameters `structure`, `adjoint` and `unroll`).
    - `scan`: `scan(a, u, zi, *, adjoint, unroll)`, the recursion as XLA
      operations (one signal, or a batch in front).
    - `coefficient_drive`: `coefficient_drive(da, out, zi, adjoint)`, the
      tangent's drive from the coefficients' tangent `da`.
    - `state_cotangent`: `state_cotangent(a, ct_u, zeros, *, adjoint,
      per_sample)`, the state's cotangent from the transposed recursion's
      output `ct_u` (`zeros`: a zero state).
    - `cpu_scan`: the CPU's scan where it differs from `scan`.
    - `state_appended`: the output is the signal followed by the final
      state (the state's length more samples); otherwise typed as `u`.
    - `expand`: for a structure that composes others (instead of `scan`,
      `coefficient_drive` and `state_cotangent`), `expand(bind, a, u, zi, *,
      unroll)`: the forward recursion written with the primitive's other
      structures, `bind(structure, a, u, zi, *, adjoint, unroll)` binding
      them. The compiled kernel computes the same map in one pass; off the
      kernel the primitive lowers to the expansion, and its JVP is the
      expansion's, so reverse mode runs the other structures' adjoints.
    """

    name: str
    signal_rank: int
    step_rank: int
    kernel: Kernel
    scan: Callable | None = None
    coefficient_drive: Callable | None = None
    state_cotangent: Callable | None = None
    cpu_scan: Callable | None = None
    state_appended: bool = False
    expand: Callable | None = None

    def per_sample(self, a, u) -> bool:
        """Whether `a` holds one step's coefficients per sample of `u`."""
        return a.ndim == u.ndim - self.signal_rank + self.step_rank + 1
