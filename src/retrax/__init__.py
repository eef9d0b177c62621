"""retrax: gradients that do not unroll loops.

Differentiable recursive filters for audio, and small diffusion models used as
relations, in JAX and Equinox.
"""

import importlib.metadata

from . import (
    diffusion as diffusion,
    dynamics as dynamics,
    effects as effects,
    filters as filters,
    losses as losses,
    ops as ops,
    relations as relations,
    synth as synth,
)
from ._checkpoint import (
    Checkpoint as Checkpoint,
    load_checkpoint as load_checkpoint,
    save_checkpoint as save_checkpoint,
)
from ._distributed import (
    batch_mesh as batch_mesh,
    process_share as process_share,
    shard_batch as shard_batch,
)
from ._errors import (
    InvalidArgumentError as InvalidArgumentError,
    filter_jit as filter_jit,
)
from ._native import KernelStatus as KernelStatus, kernels as kernels


__version__ = importlib.metadata.version("retrax")
