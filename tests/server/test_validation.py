"""Ingest validation: genuine releases of every mechanism pass; forged or broken ones are refused by reason."""

from __future__ import annotations

import numpy as np
import pytest
from peep.core import features, wire
from peep.core.release import TemplateReleaser
from peep.server.bundles.catalog import BundleCatalog
from peep.server.ingest.validation import Rejection, TemplateValidator, reason_for
from peep.server.storage.sqlite import SqliteStore


@pytest.fixture
def validator(tmp_path, bundle, keypair):
    store = SqliteStore(tmp_path / "v.db")
    catalog = BundleCatalog(store, keypair[1])
    catalog.publish(bundle.files)
    yield TemplateValidator(catalog)
    store.close()


KINDS = [
    ("peep", 8.0, None),
    ("peep-raw", 8.0, None),
    ("laplace-vector", 1000.0, None),
    ("gaussian-l2", 4.0, 1e-5),
    ("laplace-l1", 64.0, None),
    ("privunit", 16.0, None),
    ("privunit-g", 16.0, None),
]


@pytest.mark.parametrize(("kind", "eps", "delta"), KINDS)
def test_genuine_releases_of_every_mechanism_are_accepted(validator, bundle, lfw100, kind, eps, delta):
    with features.enabled("seeded-noise"):
        r = TemplateReleaser(bundle, kind=kind, epsilon=eps, delta=delta, random_state=3)
        X = r.release(lfw100.images[:200])
    for row in X:
        msg = wire.make_template(
            row, device_id="cam-1", site="lobby", bundle_id=bundle.bundle_id, mechanism=r.description
        )
        v = validator.validate(msg)
        assert v.kind == kind and v.values.shape == (bundle.n_components,)


def test_the_secure_sampler_passes_too(validator, bundle, lfw100):
    r = TemplateReleaser(bundle, kind="peep", epsilon=2.0)
    row = r.release(lfw100.images[:1])[0]
    validator.validate(
        wire.make_template(row, device_id="c", site="s", bundle_id=bundle.bundle_id, mechanism=r.description)
    )


def _msg(bundle, values=None, **kw):
    with features.enabled("seeded-noise"):
        r = TemplateReleaser(bundle, kind="peep", epsilon=8.0, random_state=1)
    v = np.full(bundle.n_components, 0.5, np.float32) if values is None else values
    args = dict(device_id="cam-1", site="lobby", bundle_id=bundle.bundle_id, mechanism=r.description)
    args.update(kw)
    return wire.make_template(v, **args)


def test_unknown_bundle(validator, bundle):
    with pytest.raises(
        Rejection, match=r"bundle_id: expected a bundle published on this server, received 'eb-nope'"
    ) as e:
        validator.validate(_msg(bundle, bundle_id="eb-nope"))
    assert e.value.reason == "unknown_bundle"


def test_wrong_dimension(validator, bundle):
    with pytest.raises(Rejection, match=r"values: expected 128 coefficients .* received 64") as e:
        validator.validate(_msg(bundle, values=np.full(64, 0.5, np.float32)))
    assert e.value.reason == "wrong_dimension"


def test_claimed_guarantee_must_match_the_noise(validator, bundle):
    msg = _msg(bundle)
    msg.mechanism.epsilon_vector = 8.0  # claims 8 per vector while nc*8 = 1024 is what the noise gives
    with pytest.raises(Rejection, match=r"mechanism.epsilon_vector: expected 1024 .* received 8") as e:
        validator.validate(msg)
    assert e.value.reason == "mechanism_mismatch"
    msg = _msg(bundle)
    msg.mechanism.noise_std *= 0.5
    with pytest.raises(Rejection, match="mechanism.noise_std"):
        validator.validate(msg)


def test_values_outside_the_plausible_range(validator, bundle):
    v = np.full(bundle.n_components, 0.5, np.float32)
    v[17] = 0.5 + 41 * 0.1767767 + 0.5  # > 1 + 40 sigma
    with pytest.raises(Rejection, match=r"values\[17\]: expected within \[-7.07.*, 8.07.*\]") as e:
        validator.validate(_msg(bundle, values=v))
    assert e.value.reason == "implausible_values"
    v[17] = 1.0 + 39 * 0.1767767  # inside the margin
    validator.validate(_msg(bundle, values=v))


def test_non_finite_and_malformed(validator, bundle):
    msg = _msg(bundle)
    msg.values[3] = float("nan")
    with pytest.raises(Rejection, match="values: expected finite numbers") as e:
        validator.validate(msg)
    assert e.value.reason == "non_finite"
    with pytest.raises(Rejection) as e:
        validator.decode(b"\xff\xff\xff garbage")
    assert e.value.reason == "malformed"
    with pytest.raises(Rejection) as e:
        validator.decode(b"\x00" * (wire.MAX_TEMPLATE_BYTES + 1))
    assert e.value.reason == "too_large"


def test_invalid_epsilon_is_a_mismatch_not_a_crash(validator, bundle):
    msg = _msg(bundle)
    msg.mechanism.epsilon = 1e-300
    with pytest.raises(Rejection) as e:
        validator.validate(msg)
    assert e.value.reason == "mechanism_mismatch"


def test_reason_codes_are_a_bounded_set():
    from peep.core.exceptions import WireError

    assert reason_for(WireError("message_id: expected ...")) == "invalid_message_id"
    assert reason_for(WireError("mechanism.delta: expected ...")) == "invalid_mechanism"
    assert reason_for(WireError("soft_traits[3].value: expected ...")) == "invalid_soft_traits"
    assert reason_for(WireError("something odd")) == "invalid"


def test_a_mechanism_whose_domain_the_bundle_lacks_is_refused_at_ingest(tmp_path, keypair, lfw_background, bundle):
    """A unit-sphere template for a bundle whose projector has no 'unit' output (e.g. a bundle built
    before unit-sphere mechanisms existed) is refused by name, never scored as something else."""
    from peep.core import domains
    from peep.core.bundle import EigenfaceBundle, build_bundle_files
    from peep.core.imaging import DEFAULT_GEOMETRY
    from peep.core.projections import EigenfaceProjection
    from peep.core.projections import base as projection_base

    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(projection_base, "DOMAINS", {k: v for k, v in domains.DOMAINS.items() if k != "unit"})
    files = build_bundle_files(
        projection=EigenfaceProjection(n_components=16).fit(lfw_background.X[:300]),
        geometry=DEFAULT_GEOMETRY,
        signing_key=keypair[0],
        normalisation={},
        mechanism_defaults={},
    )
    monkeypatch.undo()
    old = EigenfaceBundle.from_files(files, keypair[1])
    store = SqliteStore(tmp_path / "v.db")
    catalog = BundleCatalog(store, keypair[1])
    catalog.publish(old.files)
    validator = TemplateValidator(catalog)
    with features.enabled("seeded-noise"):
        # The same kind for a bundle that has the output: its description, the old bundle's id.
        r = TemplateReleaser(bundle, kind="privunit", epsilon=16.0, random_state=1)
    values = np.zeros(16, np.float32)
    values[0] = 1.0
    msg = wire.make_template(values, device_id="c", site="s", bundle_id=old.bundle_id, mechanism=r.description)
    with pytest.raises(Rejection) as info:
        validator.validate(msg)
    assert info.value.reason == "mechanism_mismatch"
    assert "privunit" in str(info.value) and "'unit'" in str(info.value) and old.bundle_id in str(info.value)
    store.close()
