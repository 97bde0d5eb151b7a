"""What the Cyclone server (``service``) and the Python SDK (``pyclient``) share.

Neither imports the other; both import this package:

- ``cyclone.v1``: the stubs generated from ``protos/cyclone/v1`` (``make proto``
  rewrites that directory, and only it);
- :mod:`cyclone.dag`: workflow validation, its limits and how messages quote input;
- :mod:`cyclone.errors`: the errors that validation raises;
- :mod:`cyclone.jsonvalue`: Python values <-> ``google.protobuf.Value``;
- :mod:`cyclone.codes`: the engine's SQLSTATEs and the kinds of error they mean.
"""
