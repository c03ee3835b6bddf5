"""The ``dlib-resnet`` projection: a whitened public PCA of face descriptors, as a signed projector.

The descriptors here are synthetic (identity clusters on the 128-d sphere,
like dlib's); the network itself is tested on real faces in
tests/edge/test_embedding.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from peep.core.bundle import ProjectionBundle, build_bundle_files, write_bundle_files
from peep.core.domains import DOMAINS, unit_rows
from peep.core.exceptions import BundleError
from peep.core.imaging import DEFAULT_GEOMETRY
from peep.core.projections import DlibResNetProjection, projection_class, projector_outputs
from peep.core.projections.descriptor import DLIB_RESNET_MODEL_SHA256, untrusted_network

K = 8
NETWORK = {"kind": "dlib-resnet", **DLIB_RESNET_MODEL_SHA256, "package": "face_recognition_models 0.3.0"}


def _descriptors(rng: np.random.Generator, n_people: int = 40, per: int = 6) -> tuple[np.ndarray, np.ndarray]:
    centres = unit_rows(rng.normal(size=(n_people, 128)))
    y = np.repeat(np.arange(n_people), per)
    D = unit_rows(centres[y] + 0.35 * rng.normal(size=(y.size, 128)) / np.sqrt(128))
    return D, y


@pytest.fixture(scope="module")
def public() -> tuple[np.ndarray, np.ndarray]:
    return _descriptors(np.random.default_rng(7))


@pytest.fixture(scope="module")
def fitted(public) -> DlibResNetProjection:
    return DlibResNetProjection(n_components=K, network=NETWORK).fit(public[0])


@pytest.fixture(scope="module")
def descriptor_bundle(fitted, keypair, tmp_path_factory) -> ProjectionBundle:
    files = build_bundle_files(
        projection=fitted,
        geometry=DEFAULT_GEOMETRY,
        signing_key=keypair[0],
        normalisation={},
        mechanism_defaults={"kind": "privunit", "epsilon": 8.0},
    )
    return ProjectionBundle.load(write_bundle_files(files, tmp_path_factory.mktemp("dlib")), keypair[1])


def test_registered_with_its_contract():
    cls = projection_class("dlib-resnet")
    assert cls is DlibResNetProjection and cls.input_kind == "dlib-resnet" and not cls.needs_labels
    assert not cls.mirror_by_default and cls.summary


def test_whitened_axes_of_the_public_descriptors(fitted, public):
    C = fitted.transform(public[0])
    assert C.shape == (public[0].shape[0], K)
    # Whitening: every kept direction has unit variance on the public descriptors, and they are uncorrelated.
    np.testing.assert_allclose(np.cov(C.T, bias=False), np.eye(K), atol=1e-8)
    assert fitted.explained_variance_ratio_.shape == (K,) and np.all(np.diff(fitted.explained_variance_ratio_) <= 0)


def test_the_projector_equals_the_numpy_transform_in_every_domain(fitted, descriptor_bundle, rng):
    b = descriptor_bundle
    assert b.projection_kind == "dlib-resnet" and b.input_kind == "dlib-resnet" and b.outputs == projector_outputs()
    assert b.n_features == 128
    D, _ = _descriptors(rng, n_people=5, per=4)
    out = b.project(D)
    ref = fitted.transform(D)
    np.testing.assert_allclose(out["coefficients"], ref, atol=1e-5 * np.abs(ref).max())
    for name, dom in DOMAINS.items():
        expected = dom.apply(ref, b.bounds)
        np.testing.assert_allclose(out[name], expected, atol=1e-5 * max(1.0, np.abs(expected).max()), err_msg=name)
    np.testing.assert_allclose(np.linalg.norm(out["unit"], axis=1), 1.0, atol=1e-5)
    # One descriptor (what the device releases) is one row.
    np.testing.assert_allclose(b.project(D[0], output="unit"), out["unit"][:1], atol=1e-6)
    b.check_mechanism("privunit")


def test_the_signed_metadata_names_the_network_and_the_projection_reads_back(fitted, descriptor_bundle, rng):
    b = descriptor_bundle
    assert b.input == {"kind": "dlib-resnet", "dimension": 128, "network": NETWORK}
    meta = json.loads(b.files["metadata.json"])
    assert meta["input"]["network"]["network_sha256"] == DLIB_RESNET_MODEL_SHA256["network_sha256"]
    back = b.projection()
    assert isinstance(back, DlibResNetProjection) and back.network == NETWORK
    D, _ = _descriptors(rng, n_people=3, per=2)
    np.testing.assert_allclose(back.transform(D), fitted.transform(D), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(back.scales_, fitted.scales_, rtol=1e-5)


def test_a_changed_network_breaks_the_signature(descriptor_bundle, keypair):
    files = dict(descriptor_bundle.files)
    meta = json.loads(files["metadata.json"])
    meta["input"]["network"]["network_sha256"] = "0" * 64
    files["metadata.json"] = json.dumps(meta).encode()
    with pytest.raises(BundleError):
        ProjectionBundle.from_files(files, keypair[1])


def test_refuses_pixels_and_mirroring(public):
    with pytest.raises(ValueError, match="dimension 128, received dimension 4096"):
        DlibResNetProjection(n_components=4).fit(np.zeros((10, 4096)))
    with pytest.raises(ValueError, match="mirror_shape: expected None"):
        DlibResNetProjection(n_components=4, mirror_shape=(8, 16)).fit(public[0])


def test_untrusted_network_names_the_model_file():
    trusted = frozenset(DLIB_RESNET_MODEL_SHA256.values())
    assert untrusted_network({"kind": "pixels"}, trusted) is None
    assert untrusted_network({"kind": "dlib-resnet", "network": NETWORK}, trusted) is None
    other = {**NETWORK, "landmarks_sha256": "f" * 64}
    reason = untrusted_network({"kind": "dlib-resnet", "network": other}, trusted)
    assert reason is not None and "landmarks_sha256" in reason and "ffffffffffffffff…" in reason
    assert "network" in str(untrusted_network({"kind": "dlib-resnet"}, trusted))
    # An unbounded hash is never echoed whole.
    long = untrusted_network({"kind": "dlib-resnet", "network": {**NETWORK, "network_sha256": "a" * 10_000}}, trusted)
    assert long is not None and len(long) < 200
