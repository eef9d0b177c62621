"""Compiled CPU kernels, registered with XLA through its FFI.

The package build compiles `ballistics.cc` (the attack/release smoother),
`allpole.cc` (the all-pole recursion of the recurrence core, forward and
adjoint), `sections.cc` (cascades of second-order sections, in one pass),
`linear.cc` (the core's diagonal and dense recursions, forward and
adjoint, real and complex) and `graph.cc` (block Cholesky of a factor
graph's block-tridiagonal Gauss-Newton matrix, and its solve) into
`_kernels.so` against the FFI headers of the jaxlib in the build environment
(see `hatch_build.py`).
The kernels are used if that library is present and XLA accepts its handlers;
otherwise every op falls back to its pure-JAX loop, which computes the same
numbers. Setting the environment variable `RETRAX_DISABLE_KERNELS=1` forces
the fallback. `retrax.kernels()` says which kernels are active, and why not.

Compatibility with the running jaxlib follows the XLA FFI's own rules, not an
exact version match: the library talks to XLA only through the FFI's C API,
whose binary interface is versioned (`XLA_FFI_API_MAJOR.MINOR` in
`xla/ffi/api/c_api.h`). Each handler reports the version of the headers it
was compiled with, and XLA refuses to register a handler whose version it
does not support (a different major version, or one older than the oldest it
still supports, kept for at least 12 months). A library built against one
jaxlib therefore keeps working with later ones until XLA drops its version,
and then registration fails with XLA's message, which `kernels()` reports.
"""

import ctypes
import dataclasses
import functools
import os
import pathlib
import warnings

import jax


LIBRARY = pathlib.Path(__file__).with_name("_kernels.so")
BALLISTICS = "retrax_ballistics"
ALLPOLE = "retrax_allpole"
ALLPOLE_LAGS = "retrax_allpole_lags"
ALLPOLE_LAG_DOT = "retrax_allpole_lag_dot"
LINEAR = "retrax_linear"
SECTIONS = "retrax_sections"
SECTIONS_SAVED = "retrax_sections_saved"
SECTIONS_ADJOINT = "retrax_sections_adjoint"
BLOCK_CHOLESKY = "retrax_block_cholesky"
BLOCK_CHOLESKY_SOLVE = "retrax_block_cholesky_solve"
_DISABLE = "RETRAX_DISABLE_KERNELS"

# Public kernel name -> its (XLA FFI target name, symbol of the handler)s.
_KERNELS = {
    "ballistics": ((BALLISTICS, "RetraxBallistics"),),
    "allpole": (
        (ALLPOLE, "RetraxAllpole"),
        (ALLPOLE_LAGS, "RetraxAllpoleLags"),
        (ALLPOLE_LAG_DOT, "RetraxAllpoleLagDot"),
        (SECTIONS, "RetraxSections"),
        (SECTIONS_SAVED, "RetraxSectionsSaved"),
        (SECTIONS_ADJOINT, "RetraxSectionsAdjoint"),
    ),
    "linear": ((LINEAR, "RetraxLinear"),),
    "graph": (
        (BLOCK_CHOLESKY, "RetraxBlockCholesky"),
        (BLOCK_CHOLESKY_SOLVE, "RetraxBlockCholeskySolve"),
    ),
}
# The dtypes each kernel computes (others run the pure-JAX loop).
_DTYPES = {
    "ballistics": "float32 and float64",
    "allpole": "float32, float64, complex64 and complex128 (cascades of "
    "second-order sections: float32 and float64)",
    "linear": "float32, float64, complex64 and complex128",
    "graph": "float32 and float64",
}


@dataclasses.dataclass(frozen=True)
class KernelStatus:
    """Whether one of retrax's compiled CPU kernels is in use, and why.

    **Fields:**

    - `active`: `True` if the kernel is loaded and registered with XLA; ops
      then use it on the CPU for the dtypes its `reason` names (on other
      devices, and for other dtypes, they run their pure-JAX loop).
    - `reason`: why it is active or not, in words (for example the library
      is missing because the package was built without a C++ compiler, it
      was disabled with `RETRAX_DISABLE_KERNELS=1`, or XLA refused it).
    - `library`: the path of the compiled library that holds the kernel.
    """

    active: bool
    reason: str
    library: str


class KernelWarning(UserWarning):
    """A compiled kernel retrax would use on the CPU is not available."""


def _built_for(library: ctypes.CDLL) -> str:
    try:
        function = library.RetraxJaxlibVersion
    except AttributeError:
        return "an unknown jaxlib"
    function.restype = ctypes.c_char_p
    return "jaxlib " + function().decode()


@functools.cache
def _load() -> dict[str, tuple[bool, str]]:
    """Load the library and register its handlers with XLA, once: for each
    kernel, whether it is active and why (a library built before a kernel
    was added lacks only that kernel's handler)."""

    def every(reason):
        return {name: (False, reason) for name in _KERNELS}

    if os.environ.get(_DISABLE, "") not in ("", "0"):
        return every(f"disabled by the environment variable {_DISABLE}=1")
    if not LIBRARY.is_file():
        return every(
            f"not built: {LIBRARY.name} is missing (the package was installed "
            "without a C++ compiler, or the compilation failed; reinstall with "
            "`pip install -v` to see the build's message)"
        )
    try:
        library = ctypes.CDLL(str(LIBRARY))
    except OSError as e:
        return every(f"{LIBRARY.name} could not be loaded: {e}")
    built_for = _built_for(library)
    status = {}
    for name, handlers in _KERNELS.items():
        try:
            jax.devices("cpu")  # registration is checked now, not at first use
            for target, symbol in handlers:
                handler = jax.ffi.pycapsule(getattr(library, symbol))
                jax.ffi.register_ffi_target(target, handler, platform="cpu")
        except AttributeError:
            status[name] = (
                False,
                (
                    f"not built: {LIBRARY.name} (compiled for {built_for}) has no "
                    f"{symbol} handler; rebuild retrax"
                ),
            )
        except Exception as e:  # XLA's own message says why it refused
            status[name] = (
                False,
                (
                    f"XLA refused the kernels, compiled for {built_for}; rebuild "
                    f"retrax for this jaxlib ({type(e).__name__}: {e})"
                ),
            )
        else:
            status[name] = (
                True,
                (
                    f"loaded from {LIBRARY.name} (compiled for {built_for}), used "
                    f"on the CPU for {_DTYPES[name]}"
                ),
            )
    return status


def available(name: str = "ballistics") -> bool:
    """Whether the compiled kernel `name` is loaded and registered with XLA."""
    return _load()[name][0]


def kernels() -> dict[str, KernelStatus]:
    """Which of retrax's compiled CPU kernels are in use, and why not.

    `retrax.ops.ballistics` (and so the dynamics processors built on it, such
    as `retrax.filters.Compressor`), the all-pole recursion behind
    `retrax.ops.allpole`, `linear_recurrence`, `lfilter`, `lfilter_tv` and
    `sosfilt`, and the diagonal and dense recursions behind
    `retrax.ops.diag_state_space`, `state_space`, `comb`, the state-variable
    filter and the derivatives of `ballistics` (values and derivatives), and
    the block Cholesky factorisation and solve of
    `retrax.relations.solve_graph`'s least-squares steps on banded graphs
    (`"graph"`) run compiled loops on the CPU, built with the package when a
    C++ compiler is available. Without them the ops run pure-JAX loops that
    give the same numbers, more slowly; this function says which one is in
    use.

    **Returns:**

    A dict from kernel name (`"ballistics"`, `"allpole"`, `"linear"`,
    `"graph"`) to its
    [`retrax.KernelStatus`][]: `active` and a `reason` in words.

    !!! Example

        ```python
        >>> retrax.kernels()["ballistics"].active
        True
        ```
    """
    return {
        name: KernelStatus(active=active, reason=reason, library=str(LIBRARY))
        for name, (active, reason) in _load().items()
    }


@functools.cache
def warn_if_missing() -> None:
    """Warn, once per process, when an op would use a kernel on the CPU but
    it is not active for a reason other than the user's own choice."""
    missing = [reason for active, reason in _load().values() if not active]
    if not missing or os.environ.get(_DISABLE, "") not in ("", "0"):
        return
    if jax.default_backend() != "cpu":
        return
    warnings.warn(
        f"retrax's compiled CPU kernels are not in use: {missing[0]}. The pure-JAX "
        f"loops give the same numbers, more slowly. Set {_DISABLE}=1 to "
        "choose them and silence this warning; see `retrax.kernels()`.",
        KernelWarning,
        stacklevel=3,
    )
