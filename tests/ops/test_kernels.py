"""`retrax.kernels()`: which compiled CPU kernels are in use, and why not."""

import json
import os
import pathlib
import subprocess
import sys
import warnings

import jax
import jax.numpy as jnp
import pytest

import retrax
from retrax import _native
from retrax.ops import allpole, ballistics, diag_state_space, sosfilt


ROOT = pathlib.Path(__file__).parents[2]


def _uses_kernel(dtype=jnp.float64) -> bool:
    """Whether the compiled CPU program of `ballistics` calls the kernel."""
    x = jnp.linspace(0.0, 1.0, 8, dtype=dtype)
    text = jax.jit(lambda x: ballistics(x, 0.3, 0.1)).lower(x).as_text()
    return _native.BALLISTICS in text


def _allpole_uses_kernel(dtype=jnp.float64) -> bool:
    """Whether the CPU program of `allpole` and its gradient call the kernel."""
    x = jnp.linspace(0.0, 1.0, 8, dtype=dtype)
    a = jnp.asarray([-0.5, 0.1], dtype)
    grad = jax.grad(lambda x, a: jnp.sum(jnp.abs(allpole(x, a)) ** 2), argnums=(0, 1))
    text = jax.jit(grad).lower(x, a).as_text()
    return text.count(f"@{_native.ALLPOLE}(") == 2  # forward and adjoint


def _sections_use_kernel(dtype=jnp.float64) -> bool:
    """Whether the CPU program of a 3-section `sosfilt` makes one pass (one
    call of the cascade kernel) and its gradient one pass forward (the
    cascade kernel keeping checkpoints) and one backward (the
    cascade's adjoint kernel), with no section-by-section all-pole filter."""
    x = jnp.linspace(0.0, 1.0, 8, dtype=dtype)
    sos = jnp.asarray([[1.0, 0.5, 0.25, 1.0, -0.5, 0.1]] * 3, dtype)
    text = jax.jit(sosfilt).lower(sos, x).as_text()
    grad = jax.grad(lambda sos, x: jnp.sum(sosfilt(sos, x) ** 2), argnums=(0, 1))
    grad_text = jax.jit(grad).lower(sos, x).as_text()
    return (
        text.count(f"@{_native.SECTIONS}(") == 1
        and f"@{_native.ALLPOLE}(" not in text
        and grad_text.count(f"@{_native.SECTIONS_SAVED}(") == 1
        and grad_text.count(f"@{_native.SECTIONS_ADJOINT}(") == 1
        and f"@{_native.ALLPOLE}(" not in grad_text
    )


def _linear_uses_kernel(dtype=jnp.float64) -> bool:
    """Whether the CPU program of `diag_state_space` and its gradient call
    the diagonal/dense kernel (real and complex dtypes alike)."""
    x = jnp.linspace(0.0, 1.0, 8, dtype=dtype)[:, None]
    a = jnp.asarray([-0.5, 0.1], dtype)
    B, C = jnp.ones((2, 1), dtype), jnp.ones((1, 2), dtype)

    def loss(a, x):
        return jnp.sum(jnp.abs(diag_state_space(x, a=a, B=B, C=C, D=None)) ** 2)

    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(a, x).as_text()
    return text.count(f"@{_native.LINEAR}(") == 2  # forward and adjoint


@pytest.fixture
def fresh_status():
    """Forget the loaded status, before and after the test."""
    _native._load.cache_clear()
    _native.warn_if_missing.cache_clear()
    yield
    _native._load.cache_clear()
    _native.warn_if_missing.cache_clear()
    jax.clear_caches()


def _graph_uses_kernel(dtype=jnp.float64) -> bool:
    """Whether a banded least-squares graph solve's program calls the block
    Cholesky kernels (factorisation and solve; float64: below it the steps
    come from QR of the residual rows)."""
    import retrax.relations as rr

    graph = rr.FactorGraph(
        {"x": (8, 1)},
        [
            rr.GaussianFactor.prior("x", jnp.zeros(1, dtype), 1.0),
            rr.GaussianFactor(
                [("x", range(7)), ("x", range(1, 8))],
                jnp.asarray([[1.0, -1.0]], dtype),
                jnp.zeros((1,), dtype),
                1.0,
            ),
        ],
    )
    init = {"x": jnp.zeros((8, 1), dtype)}
    text = (
        jax.jit(lambda g, i: rr.solve_graph(g, i, linear_solver="banded").x)
        .lower(graph, init)
        .as_text()
    )
    return (
        f"@{_native.BLOCK_CHOLESKY}(" in text
        and f"@{_native.BLOCK_CHOLESKY_SOLVE}(" in text
    )


def test_status_says_whether_the_ops_use_the_kernels():
    status = retrax.kernels()
    assert set(status) == {"ballistics", "allpole", "linear", "graph"}
    uses = {
        "ballistics": _uses_kernel(),
        "allpole": _allpole_uses_kernel() and _sections_use_kernel(),
        "linear": _linear_uses_kernel(),
        "graph": _graph_uses_kernel(),
    }
    for name, kernel in status.items():
        assert isinstance(kernel, retrax.KernelStatus)
        assert kernel.library == str(_native.LIBRARY)
        assert kernel.active == uses[name], name
        if _native.LIBRARY.is_file():  # built with the package
            assert kernel.active, kernel.reason
            assert "compiled for jaxlib" in kernel.reason
        else:
            assert not kernel.active
            assert "not built" in kernel.reason
    # the all-pole kernel computes complex dtypes too, the ballistics only
    # real ones (its switch compares)
    for dtype in (jnp.complex64, jnp.complex128):
        assert _allpole_uses_kernel(dtype) == uses["allpole"], dtype
        assert dtype.__name__ in status["allpole"].reason or not uses["allpole"]
    assert _linear_uses_kernel(jnp.complex128) == uses["linear"]
    assert _sections_use_kernel(jnp.float32) == uses["allpole"]


def test_disabled_kernels_are_reported_without_a_warning():
    # A fresh process: the status is read once, when the kernels first load.
    script = (
        "import json, warnings\n"
        "warnings.simplefilter('error')\n"
        "import jax, jax.numpy as jnp, retrax\n"
        "from retrax import _native\n"
        "y = retrax.ops.ballistics(jnp.ones(4), 0.3, 0.1)\n"
        "text = jax.jit(lambda x: retrax.ops.ballistics(x, 0.3, 0.1))"
        ".lower(jnp.ones(4)).as_text()\n"
        "a = jnp.asarray([-0.5])\n"
        "text += jax.jit(lambda x: retrax.ops.allpole(x, a))"
        ".lower(jnp.ones(4)).as_text()\n"
        "text += jax.jit(lambda x: retrax.ops.diag_state_space("
        "x, a=a, B=jnp.ones((1, 1)), C=jnp.ones((1, 1)), D=None))"
        ".lower(jnp.ones((4, 1))).as_text()\n"
        "sos = jnp.asarray([[1.0, 0.5, 0.2, 1.0, -0.5, 0.1]] * 2)\n"
        "text += jax.jit(retrax.ops.sosfilt).lower(sos, jnp.ones(4)).as_text()\n"
        "k = retrax.kernels()['ballistics']\n"
        "assert retrax.kernels()['allpole'].reason == k.reason\n"
        "assert retrax.kernels()['linear'].reason == k.reason\n"
        "names = (_native.BALLISTICS, _native.ALLPOLE, _native.LINEAR, "
        "_native.SECTIONS)\n"
        "print(json.dumps({'active': k.active, 'reason': k.reason,"
        " 'called': any(name in text for name in names)}))\n"
    )
    env = dict(os.environ, RETRAX_DISABLE_KERNELS="1", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(proc.stdout.splitlines()[-1])
    assert status == {
        "active": False,
        "reason": "disabled by the environment variable RETRAX_DISABLE_KERNELS=1",
        "called": False,
    }


def test_missing_library_is_reported_and_warned_once(
    fresh_status, monkeypatch, tmp_path
):
    monkeypatch.setattr(_native, "LIBRARY", tmp_path / "_kernels.so")
    monkeypatch.delenv("RETRAX_DISABLE_KERNELS", raising=False)
    for kernel in retrax.kernels().values():
        assert not kernel.active
        assert "not built: _kernels.so is missing" in kernel.reason
        assert "pip install -v" in kernel.reason
    x = jnp.linspace(0.0, 1.0, 8)
    with pytest.warns(_native.KernelWarning, match="not built"):
        ballistics(x, 0.3, 0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert not _uses_kernel()  # the pure-JAX loops
        assert not _allpole_uses_kernel()
        assert not _linear_uses_kernel()


def test_library_that_xla_refuses_is_reported(fresh_status, monkeypatch):
    # XLA checks each handler's FFI API version when it is registered; its
    # refusal must reach the status, and the ops fall back to the loop.
    def refuse(name, fn, platform="cpu", **kwargs):
        raise RuntimeError("the handler's API version (9.0) is incompatible")

    if not _native.LIBRARY.is_file():
        pytest.skip("the package was built without the kernels")
    monkeypatch.setattr(jax.ffi, "register_ffi_target", refuse)
    monkeypatch.delenv("RETRAX_DISABLE_KERNELS", raising=False)
    kernel = retrax.kernels()["ballistics"]
    assert not kernel.active
    assert "XLA refused the kernels" in kernel.reason
    assert "API version (9.0) is incompatible" in kernel.reason
