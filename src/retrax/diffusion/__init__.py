"""Small diffusion models over a factor's coordinates.

- Schedules: `AbstractNoiseSchedule`, `VPSDE`.
- Noise predictors: `AbstractPredictor`, `NoisePredictor` (a network),
  `GaussianMixtureEps` and `kde_predictor` (exact, closed form),
  `EnergyNetwork` (a conservative field), `OnlineKDE` (a streaming mixture);
  their derivatives `epsilon_jacobian` and `epsilon_vjp_params`.
- Networks: `TimeEmbedding`, `TimeMLP`, `FiLMResidualMLP`, `ChannelTransformer`.
- Training: `fit` (and `fit_solution`, the whole run as a `TrainSolution`),
  `TrainState`, and checkpoints (`save_checkpoint`,
  `load_checkpoint`, `Checkpoint`). Sampling: `sample_ancestral`,
  `sample_euler_maruyama`, `sample_ddim`, `sample_ode`, `sample_conditional`,
  and `log_likelihood`.
"""

from .._solution import AbstractSolution as AbstractSolution
from ._belief import (
    LaplaceBelief as LaplaceBelief,
    MixtureBelief as MixtureBelief,
    implicit_laplace as implicit_laplace,
    implicit_mixture as implicit_mixture,
    laplace_belief as laplace_belief,
)
from ._channel import (
    AbstractChannel as AbstractChannel,
    Latent as Latent,
    Observed as Observed,
    Unobserved as Unobserved,
)
from ._checkpoint import (
    Checkpoint as Checkpoint,
    load_checkpoint as load_checkpoint,
    save_checkpoint as save_checkpoint,
)
from ._energy import EnergyNetwork as EnergyNetwork
from ._factor import (
    Factor as Factor,
    assemble_state as assemble_state,
    blockranges as blockranges,
    factor_infer as factor_infer,
    factor_pullback as factor_pullback,
)
from ._field import ImplicitDiffusion as ImplicitDiffusion
from ._free_energy import local_free_energy as local_free_energy
from ._gaussian import (
    AbstractGaussian as AbstractGaussian,
    CanonicalGaussian as CanonicalGaussian,
    MomentGaussian as MomentGaussian,
    combine as combine,
    divide as divide,
)
from ._infer import (
    ImplicitPullback as ImplicitPullback,
    implicit_infer as implicit_infer,
    implicit_pullback as implicit_pullback,
)
from ._kde import (
    OnlineKDE as OnlineKDE,
    kde_bandwidth as kde_bandwidth,
    kde_predictor as kde_predictor,
)
from ._measurement import (
    sample_dps as sample_dps,
    sample_tweedie_projection as sample_tweedie_projection,
)
from ._message import (
    channel_anchor as channel_anchor,
    factor_messages as factor_messages,
)
from ._mixture import (
    GaussianMixtureEps as GaussianMixtureEps,
    mixture_logdensity as mixture_logdensity,
)
from ._mixture_prox import MixtureProx as MixtureProx
from ._models import (
    ChannelTransformer as ChannelTransformer,
    FiLMResidualMLP as FiLMResidualMLP,
    TimeEmbedding as TimeEmbedding,
    TimeMLP as TimeMLP,
)
from ._nodes import (
    FieldNodes as FieldNodes,
    data_levels as data_levels,
    density_lambda as density_lambda,
    field_nodes as field_nodes,
    noisefree_nodes as noisefree_nodes,
)
from ._ode import log_likelihood as log_likelihood, sample_ode as sample_ode
from ._potential import implicit_energy as implicit_energy
from ._predictor import (
    AbstractExactPredictor as AbstractExactPredictor,
    AbstractPredictor as AbstractPredictor,
    NoisePredictor as NoisePredictor,
    default_input as default_input,
    epsilon_jacobian as epsilon_jacobian,
    epsilon_vjp_params as epsilon_vjp_params,
)
from ._prox import (
    AbstractProximalPredictor as AbstractProximalPredictor,
    ProxNetwork as ProxNetwork,
    default_prox_input as default_prox_input,
    proximal_matching_loss as proximal_matching_loss,
)
from ._prox_infer import ProxSolution as ProxSolution, prox_infer as prox_infer
from ._prox_sample import ProxSample as ProxSample, proxdm_sample as proxdm_sample
from ._reddiff import (
    REDDiff as REDDiff,
    REDDiffSolution as REDDiffSolution,
    calibrate_lambda as calibrate_lambda,
    reddiff_solve as reddiff_solve,
    reddiff_weight as reddiff_weight,
    regulariser_gradient as regulariser_gradient,
)
from ._relation import AbstractImplicitRelation as AbstractImplicitRelation
from ._relations import (
    IndexedRelation as IndexedRelation,
    ProductRelation as ProductRelation,
    named_relation as named_relation,
)
from ._roots import (
    ImplicitRoots as ImplicitRoots,
    implicit_roots as implicit_roots,
    roots_by_energy as roots_by_energy,
)
from ._sample import (
    sample_ancestral as sample_ancestral,
    sample_conditional as sample_conditional,
    sample_ddim as sample_ddim,
    sample_euler_maruyama as sample_euler_maruyama,
)
from ._schedule import VPSDE as VPSDE, AbstractNoiseSchedule as AbstractNoiseSchedule
from ._solution import RESULTS as RESULTS, ImplicitSolution as ImplicitSolution
from ._solver import GuardedNewton as GuardedNewton
from ._train import (
    TrainSolution as TrainSolution,
    TrainState as TrainState,
    fit as fit,
    fit_solution as fit_solution,
)
from ._train_inference import (
    InferenceHistory as InferenceHistory,
    TaskGradient as TaskGradient,
    fit_through_inference as fit_through_inference,
    task_gradient as task_gradient,
)
