"""Building signed bundles from a face dataset (server side), for any registered projection."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from peep.core.bundle import ProjectionBundle, build_bundle_files, write_bundle_files
from peep.core.projections import projection_class
from peep.server.datasets import FaceDataset

__all__ = ["build_bundle"]

#: Advisory only: devices take mechanism and epsilon from their own config.
DEFAULT_MECHANISM = {"kind": "peep", "epsilon": 8.0, "delta": 0.0}


def build_bundle(
    dataset: FaceDataset,
    *,
    n_components: int,
    signing_key: Ed25519PrivateKey,
    out_dir: str | os.PathLike[str],
    radius_quantile: float = 0.95,
    mechanism_defaults: Mapping[str, Any] | None = None,
    projection: str = "eigenfaces",
    mirror: bool | None = None,
    network: Mapping[str, Any] | None = None,
) -> ProjectionBundle:
    """Fit the projection ``projection`` and public bounds on ``dataset``, sign, write, reload.

    ``dataset`` is the public (background) population: never the people the
    devices will release. ``mirror`` fits on the faces' mirror images too
    (None: the projection's own default, see
    :attr:`peep.core.projections.base.Projection.mirror_by_default`). A
    projection of descriptors (``dlib-resnet``) is fitted on
    ``dataset.descriptors`` and records ``network`` (the encoder's
    :attr:`~peep.edge.embedding.DlibResNetEncoder.identity`) so devices check
    they run the same network. Returns the bundle as a device would load it
    (verified with the key pair's public half), so callers can use it straight away.
    """
    cls = projection_class(projection)
    shape = (int(dataset.images.shape[1]), int(dataset.images.shape[2]))
    fitted: Any
    if cls.input_kind == "pixels":
        use_mirror = cls.mirror_by_default if mirror is None else mirror
        fitted = cls(
            n_components=n_components, radius_quantile=radius_quantile, mirror_shape=shape if use_mirror else None
        )
    else:
        if mirror:
            raise ValueError(f"mirror: expected False for projection {projection!r}, whose input is a descriptor")
        if not network:
            raise ValueError(f"network: expected the identity of the {cls.input_kind} network, received {network!r}")
        descriptor_cls: Any = cls  # the descriptor projections take the network they were fitted behind
        fitted = descriptor_cls(n_components=n_components, radius_quantile=radius_quantile, network=dict(network))
    fitted.fit(dataset.inputs(cls.input_kind), dataset.labels)
    geometry_dict = dataset.normalisation.get("geometry")
    from peep.core.imaging import FaceGeometry

    geometry = (
        FaceGeometry.from_dict(geometry_dict)
        if geometry_dict
        else FaceGeometry(width=dataset.images.shape[2], height=dataset.images.shape[1])
    )
    files = build_bundle_files(
        projection=fitted,
        geometry=geometry,
        signing_key=signing_key,
        normalisation=dataset.normalisation,
        mechanism_defaults=dict(mechanism_defaults or DEFAULT_MECHANISM),
        provenance={
            "dataset": dataset.source,
            "n_images": dataset.n_images,
            "n_subjects": dataset.n_subjects,
            "n_skipped": dataset.n_skipped,
            "radius_quantile": radius_quantile,
            "software": "peep-server 0.1.0",
        },
    )
    path = write_bundle_files(files, Path(out_dir))
    return ProjectionBundle.load(path, signing_key.public_key())
