"""PEEP server: perturbed-only storage, training, identify/verify, QBBS, bundles.

The console script is ``peep`` (:mod:`peep.server.cli`); the lab (``peep-lab``: the audit, the benchmarks, the
demo, ...) adds its commands to it.
"""

__version__ = "0.1.0"
