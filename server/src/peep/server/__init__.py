"""PEEP server: perturbed-only storage, training, identify/verify, QBBS, bundles; and the lab (audit, demo, ...).

The console script is ``peep`` (:mod:`peep.server.cli`). Which modules are the
lab, needing the extra ``lab``, is stated in :mod:`peep.server.extras`.
"""

__version__ = "0.1.0"
