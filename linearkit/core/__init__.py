"""The base of every model: ``Module`` and ``Parameter``, the ``vjp`` protocol and its guard, call
hooks, anomaly mode, the structure token that tells a model changed, and the library-wide random
generator. Imports only ``errors``, ``precision`` and ``backend`` below it."""
