"""The errors of workflow validation, below both :mod:`cyclone.dag` and
:mod:`cyclone.flow` so that each can raise them without importing the other."""

from __future__ import annotations

__all__ = ["InvalidFlow", "InvalidWorkflow"]


class InvalidWorkflow(ValueError):
    """The workflow definition is invalid."""


class InvalidFlow(InvalidWorkflow):
    """A priority, limit, start time or key template out of range (INVALID_ARGUMENT)."""
