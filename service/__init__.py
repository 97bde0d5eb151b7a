"""The Cyclone server: wiring (server, main) and three wings: api (gRPC), engine,
db (SQL)."""

# Refuses an environment that holds PyPI's other "cyclone" (see there).
import cyclone.distribution  # noqa: F401
