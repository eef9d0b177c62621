import os
import pathlib

import jax
import pytest


jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get(
        "RETRAX_TEST_CACHE", str(pathlib.Path(__file__).parent.parent / ".jax_cache")
    ),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    # A test process compiles thousands of small programs; dropping the
    # in-memory caches after each module keeps the number of live executables
    # (and their code mappings) bounded. The on-disk cache still serves repeats.
    yield
    jax.clear_caches()


@pytest.fixture
def getkey():
    """A fresh PRNG key on every call, reproducible per test."""
    state = {"key": jax.random.key(0)}

    def _getkey():
        state["key"], sub = jax.random.split(state["key"])
        return sub

    return _getkey
