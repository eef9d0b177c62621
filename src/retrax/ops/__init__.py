"""Differentiable linear recursive filters whose gradients run the adjoint filter."""

from ._allpole import allpole as allpole, linear_recurrence as linear_recurrence
