"""Small diffusion models over a factor's coordinates, and inverse problems with them.

- Schedules: `AbstractNoiseSchedule`, `VPSDE`.
- Noise predictors: `AbstractPredictor`, `NoisePredictor` (a network),
  `GaussianMixtureEps` and `kde_predictor` (exact, closed form),
  `EnergyNetwork` (a conservative field), `OnlineKDE` (a streaming mixture);
  their derivatives `epsilon_jacobian` and `epsilon_vjp_params`.
- Networks: `TimeEmbedding`, `TimeMLP`, `FiLMResidualMLP`, `ChannelTransformer`.
- Training: `fit` (and `fit_solution`, the whole run as a `TrainSolution`)
  and `TrainState`. The checkpoints `fit` writes are generic and live at the
  top level: `retrax.save_checkpoint`, `retrax.load_checkpoint`,
  `retrax.Checkpoint`. Sampling: `sample_ancestral`,
  `sample_euler_maruyama`, `sample_ddim`, `sample_ode`, `sample_conditional`
  (each returns a `Sample`), and `log_likelihood` (a `LogLikelihood`).
- Inverse problems: RED-Diff (`REDDiff`, `reddiff_solve`, `REDDiffSolution`,
  `reddiff_weight`, `calibrate_lambda`, `regulariser_gradient`), proximal
  diffusion models (`AbstractProximalPredictor`, `ProxNetwork`, `MixtureProx`,
  `proximal_matching_loss`, `proxdm_sample`, `prox_infer`) and
  measurement-conditioned sampling (`sample_dps`, `sample_tweedie_projection`).
- Result codes: `RESULTS`, extending `optx.RESULTS`;
  `retrax.relations.RESULTS` extends it in turn.

Relations and inference on them (`ImplicitDiffusion`, `implicit_infer`,
factors, beliefs, ...) live in `retrax.relations`, which imports this
package; this package imports nothing from there.
"""

from .._solution import AbstractSolution as AbstractSolution
from ._energy_network import EnergyNetwork as EnergyNetwork
from ._kde import (
    OnlineKDE as OnlineKDE,
    kde_bandwidth as kde_bandwidth,
    kde_predictor as kde_predictor,
)
from ._measurement import (
    sample_dps as sample_dps,
    sample_tweedie_projection as sample_tweedie_projection,
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
from ._ode import (
    LogLikelihood as LogLikelihood,
    log_likelihood as log_likelihood,
    sample_ode as sample_ode,
)
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
from ._sample import (
    Sample as Sample,
    sample_ancestral as sample_ancestral,
    sample_conditional as sample_conditional,
    sample_ddim as sample_ddim,
    sample_euler_maruyama as sample_euler_maruyama,
)
from ._schedule import VPSDE as VPSDE, AbstractNoiseSchedule as AbstractNoiseSchedule
from ._solution import RESULTS as RESULTS
from ._train import (
    TrainSolution as TrainSolution,
    TrainState as TrainState,
    fit as fit,
    fit_solution as fit_solution,
)
