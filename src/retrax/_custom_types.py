"""Shared type aliases."""

from jaxtyping import Array, ArrayLike, Inexact


Signal = Inexact[Array, " time"]
SignalLike = Inexact[ArrayLike, " time"]
ScalarLike = Inexact[ArrayLike, ""] | float | complex
