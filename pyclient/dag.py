"""Workflow validation, as the SDK has always named it: :mod:`cyclone.dag`, shared
with the server, re-exported here so that ``from pyclient import dag`` keeps working.
What it exports is ``cyclone.dag.__all__``, so the two cannot drift apart."""

from cyclone import dag as _dag
from cyclone.dag import *  # noqa: F403

__all__ = _dag.__all__
