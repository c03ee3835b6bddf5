"""Bundles: building signed projector bundles and the catalogue of bundles the server knows."""
