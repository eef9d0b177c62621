"""Every example script runs in a short smoke mode and does what it claims."""

import importlib.util
import pathlib

import pytest


EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"


def load_example(relative: str):
    path = EXAMPLES / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _standard_promotion(monkeypatch):
    # Examples are user code: they run under JAX's default promotion rules.
    import jax

    with jax.numpy_dtype_promotion("standard"):
        yield


def test_quickstart_smoke(capsys):
    result = load_example("quickstart.py").main(smoke=True)
    assert "recovered coefficients" in capsys.readouterr().out
    # Even the short run must have made real progress from a flat start.
    assert result["loss"] < 1e-2


def test_streaming_smoke(capsys):
    result = load_example("streaming.py").main(smoke=True)
    assert "max |blocks - one call|" in capsys.readouterr().out
    # Block-by-block processing with return_zf must reproduce one call.
    scale = float(abs(result["y_full"]).max())
    assert result["y_blocks"].shape == result["y_full"].shape
    assert result["y_diff"] <= 1e-6 * scale
    assert result["envelope_diff"] <= 1e-6 * scale


def test_fit_svf_smoke(capsys):
    result = load_example("parameter_estimation/fit_svf.py").main(smoke=True)
    assert "recovered" in capsys.readouterr().out
    # From a cutoff 72% too low and no resonance, the short run gets close.
    assert result["losses"][-1] < 0.1 * result["losses"][0]
    assert result["cutoff_error"] < 0.1 * result["initial_cutoff_error"]
    assert result["q_error"] < 0.5 * result["initial_q_error"]


def test_fit_state_space_filter_smoke(capsys):
    result = load_example("parameter_estimation/fit_state_space_filter.py").main(
        smoke=True
    )
    assert "direct QR solve" in capsys.readouterr().out
    # Least squares with an exact answer: QR recovers the readout to float64
    # rounding, float32 to a conditioning-limited 1e-3, and L-BFGS descends.
    assert result["errors"]["qr"] < 1e-9
    assert result["errors"]["qr_float32"] < 1e-3
    assert result["misfit"] < 1e-9
    assert result["losses"][-1] < 1e-4 * result["losses"][0]


def test_fit_compressor_smoke(capsys):
    result = load_example("parameter_estimation/fit_compressor.py").main(smoke=True)
    assert "recovered" in capsys.readouterr().out
    losses = result["losses"]
    assert losses[-1].min() < 1e-3 * losses[0].min()
    # The best start recovers every setting to within 5%, from starts that
    # were off by factors of 2 to 4.
    assert max(result["errors"].values()) < 0.05
    for start in result["initial"]:
        assert abs(start["release_ms"] / result["truth"]["release_ms"] - 1) > 0.5


def test_fit_parametric_eq_smoke(capsys):
    result = load_example("parameter_estimation/fit_parametric_eq.py").main(smoke=True)
    assert "worst errors" in capsys.readouterr().out
    assert result["losses"][-1] < 0.05 * result["losses"][0]
    errors, initial = result["errors"], result["initial_errors"]
    assert errors["freq"] < 0.25 * initial["freq"]
    assert errors["gain_db"] < 0.25 * initial["gain_db"]
