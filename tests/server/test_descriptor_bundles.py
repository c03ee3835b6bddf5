"""Descriptor bundles (``dlib-resnet``) on the server: only the networks the deployer trusts.

The descriptors are synthetic (the projection is fitted on any 128-d rows);
what is tested is the network a bundle names, at publish, at ingest and in
the configuration. The real network runs in tests/edge/test_embedding.py and
tests/cli/test_bundle_dlib.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from peep.core import features, wire
from peep.core.bundle import ProjectionBundle, build_bundle_files
from peep.core.domains import unit_rows
from peep.core.exceptions import BundleError
from peep.core.imaging import DEFAULT_GEOMETRY
from peep.core.projections import DlibResNetProjection
from peep.core.projections.descriptor import DLIB_RESNET_MODEL_SHA256
from peep.core.release import TemplateReleaser
from peep.server.bundles.catalog import BundleCatalog
from peep.server.config import BundleConfig
from peep.server.ingest.validation import Rejection, TemplateValidator
from peep.server.storage.sqlite import SqliteStore
from pydantic import ValidationError

TRUSTED = {"kind": "dlib-resnet", **DLIB_RESNET_MODEL_SHA256, "package": "face_recognition_models 0.3.0"}
# Same file names, another network: e.g. a fine-tuned ResNet an attacker or a mistake put in a bundle.
OTHER = {**TRUSTED, "network_sha256": "ab" * 32}


def _files(network: dict, keypair) -> dict[str, bytes]:
    rng = np.random.default_rng(3)
    D = unit_rows(rng.normal(size=(200, 128)))
    projection = DlibResNetProjection(n_components=8, network=network).fit(D)
    return build_bundle_files(
        projection=projection,
        geometry=DEFAULT_GEOMETRY,
        signing_key=keypair[0],
        normalisation={},
        mechanism_defaults={"kind": "privunit", "epsilon": 8.0},
    )


@pytest.fixture
def store(tmp_path):
    s = SqliteStore(tmp_path / "d.db")
    yield s
    s.close()


def test_a_bundle_naming_the_trusted_network_is_published(store, keypair):
    b = BundleCatalog(store, keypair[1]).publish(_files(TRUSTED, keypair))
    assert b.input_kind == "dlib-resnet" and b.n_features == 128
    assert b.input["network"]["network_sha256"] == DLIB_RESNET_MODEL_SHA256["network_sha256"]


def test_a_bundle_naming_another_network_is_refused_at_publish(store, keypair):
    files = _files(OTHER, keypair)
    with pytest.raises(BundleError, match=r"input\.network\.network_sha256.*abababab.*trusted_descriptor_models"):
        BundleCatalog(store, keypair[1]).publish(files)
    assert store.get_bundle(ProjectionBundle.from_files(files, keypair[1]).bundle_id) is None


def test_a_stored_bundle_whose_network_is_no_longer_trusted_is_refused_at_ingest(store, keypair):
    published = BundleCatalog(store, keypair[1]).publish(_files(TRUSTED, keypair))
    with features.enabled("seeded-noise"):
        r = TemplateReleaser(published, kind="privunit", epsilon=8.0, random_state=1)
        row = r.release(unit_rows(np.random.default_rng(1).normal(size=(1, 128))))[0]
    msg = wire.make_template(
        row, device_id="cam-1", site="lobby", bundle_id=published.bundle_id, mechanism=r.description
    )
    assert TemplateValidator(BundleCatalog(store, keypair[1])).validate(msg).values.shape == (8,)
    # The deployer removed the network from the trusted list (a model found faulty): its templates stop.
    distrusting = BundleCatalog(store, keypair[1], trusted_models=[DLIB_RESNET_MODEL_SHA256["landmarks_sha256"]])
    with pytest.raises(Rejection) as e:
        TemplateValidator(distrusting).validate(msg)
    assert e.value.reason == "untrusted_network" and "network_sha256" in str(e.value)


def test_pixel_bundles_do_not_depend_on_the_trusted_list(store, keypair, bundle):
    assert BundleCatalog(store, keypair[1], trusted_models=[]).publish(bundle.files).input_kind == "pixels"


def test_trusted_models_must_be_sha256_hex(tmp_path):
    key = tmp_path / "site.pub"
    key.write_text("x")
    assert BundleConfig(public_key=key).trusted_descriptor_models == sorted(DLIB_RESNET_MODEL_SHA256.values())
    with pytest.raises(ValidationError, match=r"(?s)trusted_descriptor_models.*64 lower-case hex.*'not-a-hash'"):
        BundleConfig(public_key=key, trusted_descriptor_models=["not-a-hash"])
