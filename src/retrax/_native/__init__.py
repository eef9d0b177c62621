"""Compiled CPU kernels, registered with XLA through its FFI.

The package build compiles `ballistics.cc` into `_kernels.so` against the
FFI headers of the jaxlib in the build environment (see `hatch_build.py`).
The kernels are used only if that library is present and was compiled for
the jaxlib that is running; otherwise every op falls back to its pure-JAX
loop, which computes the same numbers. Setting the environment variable
`RETRAX_DISABLE_KERNELS=1` forces the fallback.
"""

import ctypes
import functools
import os
import pathlib

import jax
import jaxlib.version


LIBRARY = pathlib.Path(__file__).with_name("_kernels.so")
BALLISTICS = "retrax_ballistics"


@functools.cache
def available() -> bool:
    """Whether the compiled kernels are loaded and registered with XLA."""
    if os.environ.get("RETRAX_DISABLE_KERNELS", "") not in ("", "0"):
        return False
    if not LIBRARY.is_file():
        return False
    try:
        library = ctypes.CDLL(str(LIBRARY))
    except OSError:
        return False
    library.RetraxJaxlibVersion.restype = ctypes.c_char_p
    if library.RetraxJaxlibVersion().decode() != jaxlib.version.__version__:
        return False
    jax.ffi.register_ffi_target(
        BALLISTICS, jax.ffi.pycapsule(library.RetraxBallistics), platform="cpu"
    )
    return True
