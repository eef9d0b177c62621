"""Every example script runs in a short smoke mode and does what it claims.

The default set runs the examples that train nothing (the quickstart and
streaming); the smoke runs that train (a filter, an effect chain, a
relation: several seconds to half a minute of CPU each) are in the slow set,
which CI runs, as are the chain fits' full runs (`test_examples_fit_chain.py`)."""

import jax
import numpy as np
import pytest

from example_support import (  # noqa: F401  (standard_promotion: autouse fixture)
    EXAMPLES,
    load_example,
    standard_promotion,
)


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


@pytest.mark.slow
def test_circle_mlp_smoke(capsys, tmp_path):
    plot = tmp_path / "circle.png"
    result = load_example("circle_mlp.py").main(smoke=True, plot_path=str(plot))
    out = capsys.readouterr().out
    assert "radius" in out and "relative difference" in out
    assert plot.stat().st_size > 0
    # A third of the training already answers every query on the right
    # branch, converged and stable, within 0.04 of the spec's answers (the full
    # run is held to the spec's band in the slow test); the implicit
    # derivatives match finite differences whatever the training.
    for row in result["rows"]:
        assert row["converged"] and row["stable"], row
        assert abs(row["y"] - row["spec_y"]) <= 0.04, row
        assert 0.95 <= row["radius"] <= 1.0, row
    assert result["grad_x_rel"] < 1e-6 and result["grad_w_rel"] < 1e-6


@pytest.mark.slow
def test_fm_voices_smoke(capsys):
    result = load_example("fm_voices.py").main(smoke=True)
    out = capsys.readouterr().out
    assert "aggregate real-time factor" in out
    assert "central diff." in out
    assert result["audio_shape"] == (64, 4410)
    assert result["finite"]
    # Three carriers with levels 0.5, 0.3 and 0.2 mix to at most 1.
    assert 0.1 < result["peak"] <= 1.0
    assert result["realtime_factor"] > 0
    # The gradient with respect to the six ratios matches central differences
    # in float64, and is not trivially zero.
    assert result["grad"].shape == (6,)
    assert np.all(np.abs(result["fd"]) > 1e-3)
    assert result["grad_rel_error"] < 1e-6


@pytest.mark.slow
def test_reddiff_inverse_smoke(capsys):
    import jax.numpy as jnp

    example = load_example("reddiff_inverse.py")
    result = example.main(smoke=True)
    assert "exact MAP" in capsys.readouterr().out
    # the reported MAP is a minimum of the negative log posterior
    grad = jax.grad(example.neg_log_posterior)(result["map"])
    assert float(jnp.max(jnp.abs(grad))) < 1e-2
    # With lam calibrated on the ring's variance, RED-Diff lands on the MAP of
    # the moment-matched Gaussian prior, not on the ring's posterior mode. The
    # smoke run averages only 250 iterates: single runs scatter by a few 0.01.
    assert float(jnp.median(result["err_averaged_gaussian"])) < 0.03
    assert float(jnp.min(result["err_averaged"])) > 0.3


@pytest.mark.slow
def test_controller_smoke(capsys, tmp_path):
    plot = tmp_path / "controller.png"
    result = load_example("controller.py").main(smoke=True, plot=str(plot))
    out = capsys.readouterr().out
    assert "held-out parameter error" in out and plot.exists()
    # the reduced run already learns: its held-out error is at most half that
    # of predicting the middle of every range, and the loss fell
    assert result["ratio"] <= 0.5
    assert np.mean(result["losses"][-20:]) < 0.2 * result["losses"][0]
    # the cutoff, heard across the spectrum, is learned best
    assert result["errors"][0] < 0.3 * result["baseline"][0]


@pytest.mark.slow
def test_fit_svf_smoke(capsys):
    result = load_example("parameter_estimation/fit_svf.py").main(smoke=True)
    assert "recovered" in capsys.readouterr().out
    # From a cutoff 72% too low and no resonance, the short run gets close.
    assert result["losses"][-1] < 0.1 * result["losses"][0]
    assert result["cutoff_error"] < 0.1 * result["initial_cutoff_error"]
    assert result["q_error"] < 0.5 * result["initial_q_error"]


@pytest.mark.slow
def test_fit_fdn_reverb_smoke(capsys):
    result = load_example("fit_fdn_reverb.py").main(smoke=True)
    assert "after fitting the decay times" in capsys.readouterr().out
    # From 0.8 s in every band (up to 43% off), the EDC loss falls and the
    # short run already recovers every measured octave-band decay time
    # within the full run's 5%.
    assert result["edc_losses"][-1] < 0.3 * result["edc_losses"][0]
    assert np.all(np.abs(result["errors"]) < 0.05), result["errors"]


@pytest.mark.slow
def test_fit_chain_smoke(capsys):
    result = load_example("fit_chain.py").main(smoke=True)
    out = capsys.readouterr().out
    assert "STFT loss" in out and "max |blocks - one call|" in out
    # From normalised parameters within 0.15 of the target's, the short run
    # already lowers the STFT loss several times over.
    assert result["start_offset"] <= 0.15
    assert result["final_loss"] < 0.5 * result["losses"][0]
    # The fitted chain streamed in blocks equals one call to float32 rounding,
    # far below the signal (the full run measures it against float64: the
    # blocks and one call are both within about 1e-4 of the peak, the
    # equaliser's 60 Hz shelf having poles near z = 1; in float64 a chain
    # streams to 1e-12, see test_effects_modules.py).
    assert result["stream_shape"] == [8 * 512]
    assert result["stream_difference"] <= 1e-3 * result["output_peak"]


@pytest.mark.slow
def test_fit_chain_random_start_smoke(capsys):
    result = load_example("fit_chain_random_start.py").main(smoke=True)
    assert "response estimate" in capsys.readouterr().out
    # Phase 1's estimate of the hidden equaliser's response from the input
    # and output spectra (the compressor's gain removed frame by frame) lies
    # within 0.5 dB RMS of the response computed from its sections (0.21 dB
    # in the recorded run).
    assert result["response_error_db"] < 0.5
    # Trading the shelves and moving their summed gain into the compressor's
    # threshold and makeup gives the same chain: equal outputs to float32
    # rounding, and the canonical form gives back the hidden values.
    assert result["mirror_difference"] < 1e-4
    for name, (error, _) in result["mirror_scores"].items():
        assert error < 1e-4, (name, error)


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_fit_parametric_eq_smoke(capsys):
    result = load_example("parameter_estimation/fit_parametric_eq.py").main(smoke=True)
    assert "worst errors" in capsys.readouterr().out
    assert result["losses"][-1] < 0.05 * result["losses"][0]
    errors, initial = result["errors"], result["initial_errors"]
    assert errors["freq"] < 0.25 * initial["freq"]
    assert errors["gain_db"] < 0.25 * initial["gain_db"]


@pytest.mark.slow
def test_two_relations_smoke(capsys, tmp_path):
    plot = tmp_path / "two_relations.png"
    result = load_example("two_relations.py").main(smoke=True, plot_path=str(plot))
    out = capsys.readouterr().out
    assert "joint inference" in out and "final loss" in out
    assert plot.stat().st_size > 0
    # Even a few steps of training through the product's inference lower the
    # loss, and every answer of the product converges to a stable root.
    assert result["history"][-1] < result["history"][0]
    assert result["converged"] and result["stable"]


@pytest.mark.slow
def test_factor_graph_smoke(capsys):
    result = load_example("factor_graph.py").main(smoke=True)
    assert "max |messages - joint|" in capsys.readouterr().out
    # Message passing on the tree of Gaussian relations is exact: the beliefs
    # equal the joint solve's Laplace belief, and two sweeps settle it.
    assert result["error"] <= 1e-8
    assert result["sweeps"] <= 4
    # the engine's joint solve and belief propagation agree with both
    assert result["engine_error"] <= 1e-10


@pytest.mark.slow
def test_arm_pose_graph_smoke():
    result = load_example("arm_pose_graph.py").main(smoke=True)
    assert result["joint_result"] == "successful"
    assert result["bp_result"] == "successful"
    # belief propagation's fixed point is the joint solve's root
    assert result["bp_minus_joint_max"] <= 1e-6


@pytest.mark.slow
def test_pose2_graph_smoke():
    result = load_example("pose2_graph.py").main(smoke=True)
    assert result["result"] == "successful"
    assert result["steps_accepted"] <= result["steps"] <= 20
    # the loop closures pull the answer far closer to the truth than dead
    # reckoning
    solved, start = result["solve_graph"], result["dead_reckoning"]
    assert solved["position_rmse"] < 0.5 * start["position_rmse"]
    # the Hessian's and the Gauss-Newton marginals differ by the residuals'
    # curvature only
    assert 0 < result["hessian_vs_gauss_newton_marginals"] < 1e-2
    assert all(np.isfinite(result["last_pose_sd"]))
    if "gtsam" in result:  # an optional peer: GTSAM's answer and Marginals
        peer = result["gtsam"]
        assert peer["max_dx_vs_lm_tight"] <= 1e-6
        assert peer["marginals_max_relative_difference"] <= 1e-6


@pytest.mark.slow
def test_pose2_learned_odometry_smoke(monkeypatch):
    # it imports the Pose2 errors from pose2_graph.py, next to it
    monkeypatch.syspath_prepend(str(EXAMPLES))
    result = load_example("pose2_learned_odometry.py").main(smoke=True)
    assert result["learned results"] == ["successful"]
    means = result["mean over tracks"]
    rmse = {name: r["position_rmse"] for name, r in means.items()}
    # even a short training beats one Gaussian for every step, which spreads
    # the turns' over-reading over the straights; so does a Gaussian per bin
    # of the turn reading
    assert rmse["learned"] < rmse["one Gaussian"] < rmse["dead reckoning"]
    assert rmse["Gaussian per turn"] < rmse["one Gaussian"]
    for name in ("one Gaussian", "Gaussian per turn", "learned"):
        assert 0 <= means[name]["coverage_99"] <= 1


@pytest.mark.slow
def test_arm_beliefs_smoke(monkeypatch):
    # it imports the arm from arm_pose_graph.py, next to it (as a script does)
    monkeypatch.syspath_prepend(str(EXAMPLES))
    result = load_example("arm_beliefs.py").main(smoke=True)
    assert set(result) == {
        "default",
        "data_levels",
        "0.002-0.005",
        "belief_levels",
        "belief_levels, deblur",
    }
    for r in result.values():
        assert np.asarray(r["ratio"]).shape == (2, 2)
        assert np.all(np.isfinite(r["ratio"])) and np.all(np.asarray(r["ratio"]) > 0)
    # belief_levels hold at the schedule's t_min (the arm's data are thinner
    # than its noise there)
    assert result["belief_levels"]["levels"] == [1e-3]
    # removing the levels' smoothing only narrows the belief
    deblurred = np.asarray(result["belief_levels, deblur"]["ratio"])
    assert np.all(deblurred < np.asarray(result["belief_levels"]["ratio"]))
