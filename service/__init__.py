"""The Cyclone server: wiring (server, main), servicers, the store and its SQL."""

# Refuses an environment that holds PyPI's other "cyclone" (see there).
import cyclone.distribution  # noqa: F401
