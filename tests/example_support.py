"""Running the example scripts as users run them, for the example tests."""

import contextlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import jax
import pytest

from helpers import users_compiler


EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"
# The x64 sessions' XLA flag (conftest.py), which users do not set.
FUSION_EMITTERS_OFF = "--xla_cpu_use_fusion_emitters=false"


def load_example(relative: str):
    """The example as a module, whose `main` runs as a user runs the script:
    with XLA's optimisations (which the x64 sessions turn off) and in JAX's
    default precision (x64 off, so float32) whatever this session enables,
    unless the script switches x64 on itself. (The session's choice of XLA's
    CPU fusion emitters, see conftest.py, holds for the whole process.)"""
    path = EXAMPLES / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sets_x64 = 'jax.config.update("jax_enable_x64", True)' in path.read_text()
    with contextlib.nullcontext() if sets_x64 else jax.enable_x64(False):
        spec.loader.exec_module(module)  # module-level arrays too
    main = module.main

    def main_as_users_run_it(*args, **kwargs):
        with users_compiler():
            with contextlib.nullcontext() if sets_x64 else jax.enable_x64(False):
                return main(*args, **kwargs)

    module.main = main_as_users_run_it
    return module


def run_example_as_users_do(relative: str, **kwargs) -> dict:
    """The result of the example's `main`, run by `example_runner.py` in a
    fresh process with XLA's default CPU code generation (this session's XLA
    flags hold for its whole process), as a user runs the script."""
    env = dict(os.environ)
    flags = env.get("XLA_FLAGS", "").replace(FUSION_EMITTERS_OFF, "").strip()
    env["XLA_FLAGS"] = flags
    env["PYTHONPATH"] = os.pathsep.join(
        [str(EXAMPLES.parent / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [
            sys.executable,
            str(pathlib.Path(__file__).parent / "example_runner.py"),
            relative,
            json.dumps(kwargs),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


@pytest.fixture(autouse=True)
def standard_promotion():
    # Examples are user code: they run under JAX's default promotion rules.
    with jax.numpy_dtype_promotion("standard"):
        yield
