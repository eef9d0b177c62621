"""Dynamics processors: level conversions and differentiable gain computers."""

from ._convert import (
    amp2db as amp2db,
    coef2ms as coef2ms,
    db2amp as db2amp,
    ms2coef as ms2coef,
)
from ._gain import (
    avg as avg,
    compexp_gain as compexp_gain,
    limiter_gain as limiter_gain,
)
