"""Small diffusion models over a factor's coordinates, and inverse problems with them.

- Schedules: `AbstractNoiseSchedule`, `VPSDE`.
- Noise predictors: `AbstractPredictor`, `NoisePredictor` (a network),
  `GaussianMixtureEps` and `kde_predictor` (exact, closed form),
  `EnergyNetwork` (a conservative field), `OnlineKDE` (a streaming mixture);
  their derivatives `epsilon_jacobian` and `epsilon_vjp_params`.
- Networks: `TimeEmbedding`, `TimeMLP`, `FiLMResidualMLP`, `ChannelTransformer`.
- Training: `fit` (and `fit_solution`, the whole run as a `TrainSolution`)
  and `TrainState`. The checkpoints `fit` writes (`save_checkpoint`,
  `load_checkpoint`, `Checkpoint`) are generic and live at the top level, as
  `retrax.save_checkpoint` and so on; the names here are deprecated aliases
  of them, kept for one release. Sampling: `sample_ancestral`,
  `sample_euler_maruyama`, `sample_ddim`, `sample_ode`, `sample_conditional`
  (each returns a `Sample`), and `log_likelihood` (a `LogLikelihood`).
- Inverse problems: RED-Diff (`REDDiff`, `reddiff_solve`, `REDDiffSolution`,
  `reddiff_weight`, `calibrate_lambda`, `regulariser_gradient`), proximal
  diffusion models (`AbstractProximalPredictor`, `ProxNetwork`, `MixtureProx`,
  `proximal_matching_loss`, `proxdm_sample`, `prox_infer`) and
  measurement-conditioned sampling (`sample_dps`, `sample_tweedie_projection`).
- Result codes: `RESULTS` (shared with `retrax.relations`).

**Deprecated aliases.** Relations, implicit inference, beliefs, Gaussians,
factors, messages, free energies and training through inference now live in
`retrax.relations`. For one release, each of their names is still importable
from here as `retrax.diffusion.X`, the same object as `retrax.relations.X`:
`AbstractChannel`, `AbstractGaussian`, `AbstractImplicitRelation`,
`CanonicalGaussian`, `Factor`, `FieldNodes`, `GuardedNewton`,
`ImplicitDiffusion`, `ImplicitPullback`, `ImplicitRoots`,
`IndexedRelation`, `InferenceHistory`,
`LaplaceBelief`, `Latent`, `MixtureBelief`, `MomentGaussian`, `Observed`,
`ProductRelation`, `TaskGradient`, `Unobserved`, `assemble_state`,
`blockranges`, `channel_anchor`, `combine`, `data_levels`, `density_lambda`,
`divide`, `factor_infer`, `factor_messages`, `factor_pullback`, `field_nodes`,
`fit_through_inference`, `implicit_energy`, `implicit_infer`,
`implicit_laplace`, `implicit_mixture`, `implicit_pullback`, `implicit_roots`,
`laplace_belief`, `local_free_energy`, `named_relation`, `noisefree_nodes`,
`roots_by_energy`, `task_gradient`. Import them from `retrax.relations`; these
aliases will be removed.
"""

import typing

from .._checkpoint import (
    Checkpoint as Checkpoint,
    load_checkpoint as load_checkpoint,
    save_checkpoint as save_checkpoint,
)
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
from ._solution import RESULTS as RESULTS, ImplicitSolution as ImplicitSolution
from ._train import (
    TrainSolution as TrainSolution,
    TrainState as TrainState,
    fit as fit,
    fit_solution as fit_solution,
)


if typing.TYPE_CHECKING:
    from ..relations import (
        AbstractChannel as AbstractChannel,
        AbstractGaussian as AbstractGaussian,
        AbstractImplicitRelation as AbstractImplicitRelation,
        CanonicalGaussian as CanonicalGaussian,
        Factor as Factor,
        FieldNodes as FieldNodes,
        GuardedNewton as GuardedNewton,
        ImplicitDiffusion as ImplicitDiffusion,
        ImplicitPullback as ImplicitPullback,
        ImplicitRoots as ImplicitRoots,
        IndexedRelation as IndexedRelation,
        InferenceHistory as InferenceHistory,
        LaplaceBelief as LaplaceBelief,
        Latent as Latent,
        MixtureBelief as MixtureBelief,
        MomentGaussian as MomentGaussian,
        Observed as Observed,
        ProductRelation as ProductRelation,
        TaskGradient as TaskGradient,
        Unobserved as Unobserved,
        assemble_state as assemble_state,
        blockranges as blockranges,
        channel_anchor as channel_anchor,
        combine as combine,
        data_levels as data_levels,
        density_lambda as density_lambda,
        divide as divide,
        factor_infer as factor_infer,
        factor_messages as factor_messages,
        factor_pullback as factor_pullback,
        field_nodes as field_nodes,
        fit_through_inference as fit_through_inference,
        implicit_energy as implicit_energy,
        implicit_infer as implicit_infer,
        implicit_laplace as implicit_laplace,
        implicit_mixture as implicit_mixture,
        implicit_pullback as implicit_pullback,
        implicit_roots as implicit_roots,
        laplace_belief as laplace_belief,
        local_free_energy as local_free_energy,
        named_relation as named_relation,
        noisefree_nodes as noisefree_nodes,
        roots_by_energy as roots_by_energy,
        task_gradient as task_gradient,
    )

# The deprecated aliases of `retrax.relations`, resolved on first use (PEP 562):
# the relation modules import this package's modules, so importing
# `retrax.relations` here would make `import retrax.relations` circular.
_RELATIONS_ALIASES = frozenset(
    {
        "AbstractChannel",
        "AbstractGaussian",
        "AbstractImplicitRelation",
        "CanonicalGaussian",
        "Factor",
        "FieldNodes",
        "GuardedNewton",
        "ImplicitDiffusion",
        "ImplicitPullback",
        "ImplicitRoots",
        "IndexedRelation",
        "InferenceHistory",
        "LaplaceBelief",
        "Latent",
        "MixtureBelief",
        "MomentGaussian",
        "Observed",
        "ProductRelation",
        "TaskGradient",
        "Unobserved",
        "assemble_state",
        "blockranges",
        "channel_anchor",
        "combine",
        "data_levels",
        "density_lambda",
        "divide",
        "factor_infer",
        "factor_messages",
        "factor_pullback",
        "field_nodes",
        "fit_through_inference",
        "implicit_energy",
        "implicit_infer",
        "implicit_laplace",
        "implicit_mixture",
        "implicit_pullback",
        "implicit_roots",
        "laplace_belief",
        "local_free_energy",
        "named_relation",
        "noisefree_nodes",
        "roots_by_energy",
        "task_gradient",
    }
)


def __getattr__(name: str) -> typing.Any:
    if name not in _RELATIONS_ALIASES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .. import relations

    value = getattr(relations, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_RELATIONS_ALIASES})
