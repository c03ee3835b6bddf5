"""Projections: what a bundle's projector computes from a normalised face.

:mod:`~peep.core.projections.base`
    :class:`Projection` (the contract) and :func:`build_projector` (the
    signed bundle's ONNX graph: the projection's head, then the shared
    bounding into every release domain).
:mod:`~peep.core.projections.registry`
    The one list of projection kinds.
:mod:`~peep.core.projections.eigenfaces`
    ``eigenfaces`` (PEEP Alg. 1).
:mod:`~peep.core.projections.fisherfaces`
    ``fisherfaces`` (whitened eigenfaces, then LDA on the public identities;
    its ``unit`` output is what the unit-sphere mechanisms release).
:mod:`~peep.core.projections.descriptor`
    ``dlib-resnet`` (a whitened public PCA of dlib's 128-d ResNet face
    descriptor, which the device computes per release: the projector's input
    is the descriptor, not pixels).

Adding a projection: a new module here with a :class:`Projection` subclass
decorated with :func:`register_projection`, and its tests.
"""

from __future__ import annotations

from peep.core.projections.base import Projection, build_projector, mirror_faces, projector_outputs
from peep.core.projections.descriptor import DlibResNetProjection
from peep.core.projections.eigenfaces import EigenfaceProjection
from peep.core.projections.fisherfaces import FisherfaceProjection
from peep.core.projections.registry import (
    projection_class,
    projection_classes,
    projection_kinds,
    register_projection,
)

__all__ = [
    "DlibResNetProjection",
    "EigenfaceProjection",
    "FisherfaceProjection",
    "Projection",
    "build_projector",
    "mirror_faces",
    "projection_class",
    "projection_classes",
    "projection_kinds",
    "projector_outputs",
    "register_projection",
]
