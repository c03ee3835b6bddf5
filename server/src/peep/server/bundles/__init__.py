"""Bundles: building signed projector bundles and the catalogue of bundles the server knows.

The face others use: :mod:`~peep.server.bundles.build` (``build_bundle``: fit, export and sign a bundle),
:mod:`~peep.server.bundles.catalog` (``BundleCatalog``: the bundles a server verifies and serves, and their wire
form) and :mod:`~peep.server.bundles.calibrate` (the public calibration faces a device threshold is set on). Each
module's ``__all__`` names what it offers; anything else is the module's own
(``tests/server/test_public_faces.py``).
"""

__all__ = ["build", "calibrate", "catalog"]
