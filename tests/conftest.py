import os
import pathlib

import jax
import pytest


# The float32 session (`RETRAX_TEST_FLOAT32=1`) keeps JAX's default precision,
# the users' default, and runs only the tests marked `float32`; the default
# session enables x64 and deselects them.
FLOAT32_SESSION = os.environ.get("RETRAX_TEST_FLOAT32", "0") == "1"
FUSION_EMITTERS_OFF = "--xla_cpu_use_fusion_emitters=false"
if not FLOAT32_SESSION:
    # XLA's CPU backend compiles fusions with its MLIR fusion emitters by
    # default; its elemental emitters generate the same arithmetic at about
    # half the compile time, and compiling is most of this suite's CPU time
    # (test_proxdm.py: 86 s of CPU with the default, 51 s without). Read when
    # the CPU client starts, so set before any computation. Subprocesses that
    # the tests start (the checkpoint fault test) inherit it; the tests of the
    # float32 examples' claimed accuracy run the scripts without it, as users
    # do (example_support.run_example_as_users_do).
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), FUSION_EMITTERS_OFF]
    ).strip()
    jax.config.update("jax_enable_x64", True)
    # Thousands of small programs, each run a few times: XLA's optimisation
    # passes cost more than they save here (about a third of the suite's CPU
    # time). The float32 session keeps the users' defaults, optimised.
    jax.config.update("jax_disable_most_optimizations", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get(
        "RETRAX_TEST_CACHE", str(pathlib.Path(__file__).parent.parent / ".jax_cache")
    ),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


# The tests live in one folder per area of the library; each test carries its
# area's name as a marker (`python3 -m pytest -m relations`).
TESTS = pathlib.Path(__file__).parent
AREAS = {
    "ops": "retrax.ops: recurrences, scipy.signal's names, delay networks",
    "filters": "retrax.filters: SVF, biquads, EQ, compressor modules",
    "effects": "retrax.effects: effect modules, ranges, dasp-pytorch parity",
    "losses": "retrax.losses: STFT, time-domain and decay losses",
    "dynamics": "retrax.dynamics: conversions and gain computers",
    "synth": "retrax.synth: oscillators",
    "diffusion": "retrax.diffusion: schedules, predictors, training, samplers",
    "relations": "retrax.relations: implicit queries, beliefs, factors",
    "graph": "retrax.relations' factor-graph engine",
    "checkpoints": "checkpoints and resumed training",
    "distribution": "several devices and processes",
    "project": "imports, examples, docs, benchmarks, error plumbing",
}


def pytest_configure(config):
    for area, what in AREAS.items():
        config.addinivalue_line("markers", f"{area}: {what}")


def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        area = pathlib.Path(str(item.path)).relative_to(TESTS).parts[0]
        if area in AREAS:
            item.add_marker(area)
        in_session = (item.get_closest_marker("float32") is not None) == FLOAT32_SESSION
        (keep if in_session else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


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
