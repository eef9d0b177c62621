"""Compiled CPU kernels, registered with XLA through its FFI.

The package build compiles `ballistics.cc` into `_kernels.so` against the
FFI headers of the jaxlib in the build environment (see `hatch_build.py`).
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
_DISABLE = "RETRAX_DISABLE_KERNELS"

# Public kernel name -> (XLA FFI target name, symbol of its handler).
_KERNELS = {"ballistics": (BALLISTICS, "RetraxBallistics")}


@dataclasses.dataclass(frozen=True)
class KernelStatus:
    """Whether one of retrax's compiled CPU kernels is in use, and why.

    **Fields:**

    - `active`: `True` if the kernel is loaded and registered with XLA; ops
      then use it on the CPU for float32 and float64 (on other devices, and
      for other dtypes, they run their pure-JAX loop).
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
def _load() -> tuple[bool, str]:
    """Load the library and register its handlers with XLA, once."""
    if os.environ.get(_DISABLE, "") not in ("", "0"):
        return False, f"disabled by the environment variable {_DISABLE}=1"
    if not LIBRARY.is_file():
        return False, (
            f"not built: {LIBRARY.name} is missing (the package was installed "
            "without a C++ compiler, or the compilation failed; reinstall with "
            "`pip install -v` to see the build's message)"
        )
    try:
        library = ctypes.CDLL(str(LIBRARY))
    except OSError as e:
        return False, f"{LIBRARY.name} could not be loaded: {e}"
    built_for = _built_for(library)
    try:
        jax.devices("cpu")  # registration is checked now, not at first use
        for target, symbol in _KERNELS.values():
            handler = jax.ffi.pycapsule(getattr(library, symbol))
            jax.ffi.register_ffi_target(target, handler, platform="cpu")
    except Exception as e:  # XLA's own message says why it refused
        return False, (
            f"XLA refused the kernels, compiled for {built_for}; rebuild retrax "
            f"for this jaxlib ({type(e).__name__}: {e})"
        )
    return True, (
        f"loaded from {LIBRARY.name} (compiled for {built_for}), used on the "
        "CPU for float32 and float64"
    )


def available() -> bool:
    """Whether the compiled kernels are loaded and registered with XLA."""
    return _load()[0]


def kernels() -> dict[str, KernelStatus]:
    """Which of retrax's compiled CPU kernels are in use, and why not.

    `retrax.ops.ballistics` (and so the dynamics processors built on it, such
    as `retrax.filters.Compressor`) runs a compiled loop on the CPU, built
    with the package when a C++ compiler is available. Without it the ops
    run a pure-JAX loop that gives the same numbers, more slowly; this
    function says which one is in use.

    **Returns:**

    A dict from kernel name (`"ballistics"`) to its
    [`retrax.KernelStatus`][]: `active` and a `reason` in words.

    !!! Example

        ```python
        >>> retrax.kernels()["ballistics"].active
        True
        ```
    """
    active, reason = _load()
    return {
        name: KernelStatus(active=active, reason=reason, library=str(LIBRARY))
        for name in _KERNELS
    }


@functools.cache
def warn_if_missing() -> None:
    """Warn, once per process, when an op would use a kernel on the CPU but
    it is not active for a reason other than the user's own choice."""
    active, reason = _load()
    if active or os.environ.get(_DISABLE, "") not in ("", "0"):
        return
    if jax.default_backend() != "cpu":
        return
    warnings.warn(
        f"retrax's compiled CPU kernels are not in use: {reason}. The pure-JAX "
        f"loops give the same numbers, more slowly. Set {_DISABLE}=1 to "
        "choose them and silence this warning; see `retrax.kernels()`.",
        KernelWarning,
        stacklevel=3,
    )
