"""The result codes of the diffusion solves and samplers."""

import jax
import numpy as np
import optimistix as optx


class _NamedSuccess(type(optx.RESULTS)):
    """Equinox's enumeration type, with `successful` read by its name.

    A code prints as `RESULTS<message>` (equinox's `EnumerationItem.__repr__`
    reads `RESULTS[code]`), and lineax gives `successful` the empty message, so
    a success printed as `RESULTS<>`. Here the empty message reads as the
    entry's name: `RESULTS[RESULTS.successful] == "successful"` and a success
    prints `RESULTS<successful>`. The messages raised are unchanged.
    """

    def __getitem__(cls, item) -> str:
        message = super().__getitem__(item)  # checks `item`; "traced" under a trace
        value = item._value
        if isinstance(value, jax.core.Tracer) or not isinstance(
            value, np.ndarray | jax.Array
        ):
            return message
        names = {int(v._value): name for name, v in cls._name_to_item.items()}
        by_name = np.vectorize(
            lambda v: cls._index_to_message[v] or names[int(v)], otypes=[str]
        )
        return str(by_name(np.asarray(value)))


# Extends `optx.RESULTS` (itself extending `lx.RESULTS`), so the messages of the
# nonlinear and linear solvers pass through unchanged; `retrax.relations.RESULTS`
# extends this one in turn, as diffrax's extend optimistix's.
class RESULTS(optx.RESULTS, metaclass=_NamedSuccess):  # pyright: ignore
    prox_search_failed = (
        "The line search of an inner proximal solve (`MixtureProx`) found no "
        "acceptable step from a point that is not a proximal point (a non-finite "
        "objective, usually an input too large for the dtype). The result is not "
        "a proximal point; its derivatives are NaN."
    )
    nonfinite_iterate = (
        "An iterate became non-finite (NaN or inf): the function the solve or "
        "run followed (a factor graph's gradient, a data term such as "
        "RED-Diff's `data_grad`) is undefined or overflows at that point, or "
        "its step (RED-Diff's `lr`) is too large for the problem. The answer "
        "is NaN."
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
