"""The result codes of the diffusion solves and samplers."""

import optimistix as optx


# Extends `optx.RESULTS` (itself extending `lx.RESULTS`), so the messages of the
# nonlinear and linear solvers pass through unchanged; `retrax.relations.RESULTS`
# extends this one in turn, as diffrax's extend optimistix's.
class RESULTS(optx.RESULTS):  # pyright: ignore
    prox_search_failed = (
        "The line search of an inner proximal solve (`MixtureProx`) found no "
        "acceptable step from a point that is not a proximal point (a non-finite "
        "objective, usually an input too large for the dtype). The result is not "
        "a proximal point; its derivatives are NaN."
    )
    nonfinite_iterate = (
        "An iterate of the run became non-finite (NaN or inf): the gradient it "
        "followed was not finite there (a data term, e.g. RED-Diff's "
        "`data_grad`, undefined or overflowing at that point), or its step size "
        "(`lr`) is too large for the problem. The answer is NaN."
    )
    nonfinite_sample = (
        "A sampler's state became non-finite (NaN or inf) along its chain: the "
        "predictor's noise estimate was not finite there, or a step overflowed "
        "(too few `steps` for the schedule, or `sample_dps`'s `step_size` too "
        "large). The sample is NaN."
    )
    ode_failed = (
        "The probability-flow ODE solve did not reach its final time: `max_steps` "
        "was reached, or the step size collapsed on a non-finite or stiff field. "
        "Raise `max_steps` or loosen `rtol`/`atol`. The answer is NaN."
    )
    nonfinite_loss = (
        "A training step's minibatch loss was not finite (NaN or inf), so `fit` "
        "stopped there (`stats['nonfinite_step']` names the step): no update from "
        "that step on was applied, and the answer is the predictor of the last "
        "finite step. A learning rate too large, NaN or inf, or a schedule that "
        "grows, makes a run diverge; lower it, or pass `nonfinite='skip'`."
    )
    nonfinite_update = (
        "A training step's update made the parameters or the optimiser state "
        "non-finite (NaN or inf), so `fit` stopped there "
        "(`stats['nonfinite_step']` names the step): no update from that step on "
        "was applied, and the answer is the predictor of the last finite step. "
        "A learning rate too large, NaN or inf, or a schedule that grows, makes "
        "a run diverge; lower it, or pass `nonfinite='skip'`."
    )
