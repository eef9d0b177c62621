"""Small diffusion models over a factor's coordinates: schedules, noise
predictors, closed-form mixtures, training and sampling."""

from ._field import ImplicitDiffusion as ImplicitDiffusion
from ._infer import (
    implicit_infer as implicit_infer,
    implicit_pullback as implicit_pullback,
)
from ._mixture import (
    GaussianMixtureEps as GaussianMixtureEps,
    mixture_logdensity as mixture_logdensity,
)
from ._models import TimeEmbedding as TimeEmbedding, TimeMLP as TimeMLP
from ._nodes import (
    FieldNodes as FieldNodes,
    density_lambda as density_lambda,
    field_nodes as field_nodes,
    noisefree_nodes as noisefree_nodes,
)
from ._predictor import (
    AbstractExactPredictor as AbstractExactPredictor,
    AbstractPredictor as AbstractPredictor,
    NoisePredictor as NoisePredictor,
    default_input as default_input,
    epsilon_jacobian as epsilon_jacobian,
    epsilon_vjp_params as epsilon_vjp_params,
)
from ._schedule import VPSDE as VPSDE, AbstractNoiseSchedule as AbstractNoiseSchedule
from ._solution import RESULTS as RESULTS, ImplicitSolution as ImplicitSolution
from ._solver import GuardedNewton as GuardedNewton
