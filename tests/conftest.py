import os
import pathlib


# Tests compile many small programs and run them on tiny inputs: a lower XLA
# backend optimisation level cuts compile time by about a third.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")

import jax  # noqa: E402
import pytest  # noqa: E402


jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get(
        "RETRAX_TEST_CACHE", str(pathlib.Path(__file__).parent.parent / ".jax_cache")
    ),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


@pytest.fixture
def getkey():
    """A fresh PRNG key on every call, reproducible per test."""
    state = {"key": jax.random.key(0)}

    def _getkey():
        state["key"], sub = jax.random.split(state["key"])
        return sub

    return _getkey
