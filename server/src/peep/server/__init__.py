"""PEEP server: perturbed-only storage, training, identify/verify, QBBS, audit, bundles.

The console script is ``peep`` (:mod:`peep.server.cli`).
"""

__version__ = "0.1.0"
