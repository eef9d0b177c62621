"""Small diffusion models over a factor's coordinates.

- Schedules: `AbstractNoiseSchedule`, `VPSDE`.
- Noise predictors: `AbstractPredictor`, `NoisePredictor` (a network),
  `GaussianMixtureEps` and `kde_predictor` (exact, closed form),
  `EnergyNetwork` (a conservative field), `OnlineKDE` (a streaming mixture);
  their derivatives `epsilon_jacobian` and `epsilon_vjp_params`.
- Networks: `TimeEmbedding`, `TimeMLP`, `FiLMResidualMLP`, `ChannelTransformer`.
- Training: `fit`, `TrainState`, and checkpoints (`save_checkpoint`,
  `load_checkpoint`, `Checkpoint`). Sampling: `sample_ancestral`,
  `sample_euler_maruyama`, `sample_ddim`, `sample_ode`, `sample_conditional`,
  and `log_likelihood`.
"""

from ._checkpoint import (
    Checkpoint as Checkpoint,
    load_checkpoint as load_checkpoint,
    save_checkpoint as save_checkpoint,
)
from ._energy import EnergyNetwork as EnergyNetwork
from ._field import (
    AbstractImplicitRelation as AbstractImplicitRelation,
    ImplicitDiffusion as ImplicitDiffusion,
)
from ._infer import (
    ImplicitRoots as ImplicitRoots,
    LaplaceBelief as LaplaceBelief,
    MixtureBelief as MixtureBelief,
    implicit_energy as implicit_energy,
    implicit_infer as implicit_infer,
    implicit_laplace as implicit_laplace,
    implicit_mixture as implicit_mixture,
    implicit_pullback as implicit_pullback,
    implicit_roots as implicit_roots,
    laplace_belief as laplace_belief,
    roots_by_energy as roots_by_energy,
)
from ._measurement import (
    sample_dps as sample_dps,
    sample_tweedie_projection as sample_tweedie_projection,
)
from ._mixture import (
    GaussianMixtureEps as GaussianMixtureEps,
    OnlineKDE as OnlineKDE,
    kde_bandwidth as kde_bandwidth,
    kde_predictor as kde_predictor,
    mixture_logdensity as mixture_logdensity,
)
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
from ._predictor import (
    AbstractExactPredictor as AbstractExactPredictor,
    AbstractPredictor as AbstractPredictor,
    NoisePredictor as NoisePredictor,
    default_input as default_input,
    epsilon_jacobian as epsilon_jacobian,
    epsilon_vjp_params as epsilon_vjp_params,
)
from ._proxdm import (
    AbstractProximalPredictor as AbstractProximalPredictor,
    MixtureProx as MixtureProx,
    ProxNetwork as ProxNetwork,
    ProxSample as ProxSample,
    ProxSolution as ProxSolution,
    default_prox_input as default_prox_input,
    prox_infer as prox_infer,
    proxdm_sample as proxdm_sample,
    proximal_matching_loss as proximal_matching_loss,
)
from ._reddiff import (
    REDDiff as REDDiff,
    REDDiffSolution as REDDiffSolution,
    calibrate_lambda as calibrate_lambda,
    reddiff_solve as reddiff_solve,
    reddiff_weight as reddiff_weight,
    regulariser_gradient as regulariser_gradient,
)
from ._relations import (
    IndexedRelation as IndexedRelation,
    ProductRelation as ProductRelation,
    assemble_state as assemble_state,
    blockranges as blockranges,
    named_relation as named_relation,
)
from ._sample import (
    log_likelihood as log_likelihood,
    sample_ancestral as sample_ancestral,
    sample_conditional as sample_conditional,
    sample_ddim as sample_ddim,
    sample_euler_maruyama as sample_euler_maruyama,
    sample_ode as sample_ode,
)
from ._schedule import VPSDE as VPSDE, AbstractNoiseSchedule as AbstractNoiseSchedule
from ._solution import RESULTS as RESULTS, ImplicitSolution as ImplicitSolution
from ._solver import GuardedNewton as GuardedNewton
from ._train import TrainState as TrainState, fit as fit
from ._train_inference import (
    InferenceHistory as InferenceHistory,
    TaskGradient as TaskGradient,
    fit_through_inference as fit_through_inference,
    task_gradient as task_gradient,
)
