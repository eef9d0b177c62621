"""Relations: learned implicit relations over a joint space, and inference on them.

A relation is a field over a joint state; a query clamps some coordinates and
asks for the others as a stable root of the field. This package holds the
relations, their queries and what is built on the answers: beliefs,
Gaussians, factors with named channels, messages, free energies and training
through inference. The diffusion models a relation is learned from
(schedules, predictors, networks, `fit`, samplers) live in
`retrax.diffusion`, which this package imports; never the other way round.

- Relations: `AbstractImplicitRelation`, `ImplicitDiffusion` (the implicit
  field of a noise predictor), `FieldNodes` and its constructors
  (`field_nodes`, `noisefree_nodes`, `data_levels`, `belief_levels`,
  `density_lambda`);
  composed relations `IndexedRelation`, `named_relation`, `ProductRelation`.
- Queries: `implicit_infer`, `implicit_pullback` (an `ImplicitPullback`),
  `GuardedNewton`,
  `ImplicitSolution`, `RESULTS`; several answers: `implicit_roots`,
  `ImplicitRoots`, `roots_by_energy` (a `RootsByEnergy`); the energy of an answer:
  `implicit_energy`, `local_free_energy`; whether an answer is on the data:
  `calibrate_off_data`, `DataSupport`.
- Beliefs: `implicit_laplace`, `laplace_belief`, `LaplaceBelief`,
  `implicit_mixture`, `MixtureBelief`; Gaussians `AbstractGaussian`,
  `MomentGaussian`, `CanonicalGaussian`, `combine`, `divide`.
- Factors and messages: `Factor`, the channels `AbstractChannel`, `Observed`,
  `Unobserved`, `Latent`; `factor_infer`, `factor_pullback` (a `FactorPullback`),
  `factor_messages`, `channel_anchor`, `blockranges`, `assemble_state`.
- Factor graphs: `FactorGraph` of variables and factors
  (`AbstractGraphFactor`: `GaussianFactor`, `ResidualFactor`,
  `RelationFactor`); the joint solve `solve_graph` (a `GraphSolution`),
  loopy Gaussian belief propagation `propagate_beliefs` (a
  `PropagationSolution`), the Laplace beliefs `graph_laplace` and free
  energy `graph_free_energy`.
- Training through inference: `fit_through_inference` (an `InferenceFit`),
  `task_gradient`,
  `TaskGradient`, `InferenceHistory`.

`RESULTS` extends [`retrax.diffusion.RESULTS`][] (itself extending
`optx.RESULTS`) with the codes only queries give (`unstable_root`,
`invalid_query`), as diffrax's codes extend optimistix's.

Module map (what each private module holds):

- `_solution`: `RESULTS` and `ImplicitSolution`, a query's answer.
- `_abstract_relation`: `AbstractImplicitRelation`, a field over a joint space and
  a query's clamped residual.
- `_composed`: `IndexedRelation`, `named_relation`, `ProductRelation`,
  relations composed of others.
- `_field`: `ImplicitDiffusion`, the implicit field of a noise predictor.
- `_nodes`: `FieldNodes` and the noise levels a field averages.
- `_solver`: `GuardedNewton`, a root finder that settles only on stable roots.
- `_infer`: `implicit_infer`, `implicit_pullback`: one query and its
  implicit gradient.
- `_roots`: `implicit_roots`, `ImplicitRoots`, `roots_by_energy`: the
  answers several starts reach.
- `_support`: `DataSupport`, the stored training rows of the off-data test.
- `_calibration`: `calibrate_off_data`, which stores them with a relation.
- `_implicit_energy`: `implicit_energy`, the potential of a conservative
  relation's query.
- `_local_free_energy`: `local_free_energy`, energy plus the entropy term.
- `_belief`: Laplace and mixture beliefs about an answer.
- `_gaussian`: moment and canonical Gaussians, products and quotients.
- `_channel`: `Observed`, `Unobserved`, `Latent`, how a query marks a channel.
- `_factor`: `Factor`, a relation over named channels, and its queries.
- `_message`: factor-to-channel messages.
- `_train_inference`: `fit_through_inference`, a task loss on the answers
  of queries.
- `_batched_adjoint`: the implicit adjoint whose solver loop runs a vmapped
  batch of queries in chunks.
- `_graph`: `FactorGraph`, its variables' layout and sparsity.
- `_graph_factor`: the factors of a graph, rows of one energy each.
- `_graph_system`: a graph's Jacobian as a dense or block-tridiagonal system.
- `_graph_solve`: `solve_graph`, the joint MAP solve and its implicit
  derivatives.
- `_graph_propagation`: `propagate_beliefs`, loopy Gaussian belief
  propagation.
- `_graph_laplace`: `graph_laplace`, `graph_free_energy`.

Imports run one way: this package uses the public names of
`retrax.diffusion` (`AbstractPredictor`, `AbstractNoiseSchedule`, `RESULTS`)
and the helpers both packages share, which live at the root of `retrax`:
input conventions (`retrax._state`), the solution base (`retrax._solution`)
and the NaN gating of failed solves (`retrax._never_silent`).
`retrax.diffusion` imports nothing from here.
"""

from ._abstract_relation import AbstractImplicitRelation as AbstractImplicitRelation
from ._belief import (
    LaplaceBelief as LaplaceBelief,
    MixtureBelief as MixtureBelief,
    implicit_laplace as implicit_laplace,
    implicit_mixture as implicit_mixture,
    laplace_belief as laplace_belief,
)
from ._calibration import calibrate_off_data as calibrate_off_data
from ._channel import (
    AbstractChannel as AbstractChannel,
    Latent as Latent,
    Observed as Observed,
    Unobserved as Unobserved,
)
from ._composed import (
    IndexedRelation as IndexedRelation,
    ProductRelation as ProductRelation,
    named_relation as named_relation,
)
from ._factor import (
    Factor as Factor,
    FactorPullback as FactorPullback,
    assemble_state as assemble_state,
    blockranges as blockranges,
    factor_infer as factor_infer,
    factor_pullback as factor_pullback,
)
from ._field import ImplicitDiffusion as ImplicitDiffusion
from ._gaussian import (
    AbstractGaussian as AbstractGaussian,
    CanonicalGaussian as CanonicalGaussian,
    MomentGaussian as MomentGaussian,
    combine as combine,
    divide as divide,
)
from ._graph import FactorGraph as FactorGraph
from ._graph_factor import (
    AbstractGraphFactor as AbstractGraphFactor,
    GaussianFactor as GaussianFactor,
    RelationFactor as RelationFactor,
    ResidualFactor as ResidualFactor,
)
from ._graph_laplace import (
    graph_free_energy as graph_free_energy,
    graph_laplace as graph_laplace,
)
from ._graph_propagation import (
    PropagationSolution as PropagationSolution,
    propagate_beliefs as propagate_beliefs,
)
from ._graph_solve import GraphSolution as GraphSolution, solve_graph as solve_graph
from ._implicit_energy import implicit_energy as implicit_energy
from ._infer import (
    ImplicitPullback as ImplicitPullback,
    implicit_infer as implicit_infer,
    implicit_pullback as implicit_pullback,
)
from ._local_free_energy import local_free_energy as local_free_energy
from ._message import (
    channel_anchor as channel_anchor,
    factor_messages as factor_messages,
)
from ._nodes import (
    FieldNodes as FieldNodes,
    belief_levels as belief_levels,
    data_levels as data_levels,
    density_lambda as density_lambda,
    field_nodes as field_nodes,
    noisefree_nodes as noisefree_nodes,
)
from ._roots import (
    ImplicitRoots as ImplicitRoots,
    RootsByEnergy as RootsByEnergy,
    implicit_roots as implicit_roots,
    roots_by_energy as roots_by_energy,
)
from ._solution import (
    RESULTS as RESULTS,
    ImplicitSolution as ImplicitSolution,
)
from ._solver import GuardedNewton as GuardedNewton
from ._support import DataSupport as DataSupport
from ._train_inference import (
    InferenceFit as InferenceFit,
    InferenceHistory as InferenceHistory,
    TaskGradient as TaskGradient,
    fit_through_inference as fit_through_inference,
    task_gradient as task_gradient,
)
