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


@pytest.mark.slow
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


def test_an_epsilon_out_of_bounds_is_refused_by_name_not_a_crash(validator, bundle):
    msg = _msg(bundle)
    msg.mechanism.epsilon = 1e-300
    with pytest.raises(Rejection, match=r"^mechanism.epsilon: expected 0.001 <= epsilon <= 1e\+06 for peep") as e:
        validator.validate(msg)
    assert e.value.reason == "invalid_mechanism"
    msg.mechanism.epsilon = wire.MIN_EPSILON  # in bounds, but not the noise the template states
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
    from peep.core.bundle import ProjectionBundle, build_bundle_files
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
    old = ProjectionBundle.from_files(files, keypair[1])
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


# --------------------------------------------------------------------------- capture time

NOW = 1_800_000_000.0


@pytest.fixture
def clocked(tmp_path, bundle, keypair):
    store = SqliteStore(tmp_path / "c.db")
    catalog = BundleCatalog(store, keypair[1])
    catalog.publish(bundle.files)
    yield TemplateValidator(catalog, clock=lambda: NOW, max_clock_skew_s=300.0, max_age_s=30 * 86400.0)
    store.close()


@pytest.mark.parametrize("offset", [0.0, 299.0, -30 * 86400.0 + 1, -3600.0])
def test_capture_times_inside_the_window_pass(clocked, bundle, offset):
    clocked.validate(_msg(bundle, capture_time=NOW + offset))


@pytest.mark.parametrize(
    ("set_time", "reason", "match"),
    [
        (lambda t: setattr(t, "seconds", int(NOW) + 301), "capture_time_future",
         r"^capture_time: expected at most 300 s ahead of the server clock \(ingest.max_clock_skew_s\), received "
         r"2027-01-15T08:05:01Z \(301 s ahead\)"),
        (lambda t: setattr(t, "seconds", 253_402_300_799), "capture_time_future", r"received 9999-12-31T23:59:59Z"),
        (lambda t: setattr(t, "seconds", int(NOW) - 30 * 86400 - 1), "capture_time_too_old",
         r"^capture_time: expected at most 2592000 s before the server clock \(ingest.max_age_s\), received "
         r"2026-12-16T07:59:59Z"),
        (lambda t: setattr(t, "seconds", -62_135_596_800), "capture_time_too_old", r"received 0001-01-01T00:00:00Z"),
        (lambda t: t.Clear(), "capture_time_too_old", r"received 1970-01-01T00:00:00Z"),
        (lambda t: setattr(t, "seconds", 2**62), "invalid_capture_time", r"^capture_time: expected a timestamp within"),
        (lambda t: setattr(t, "seconds", -(2**62)), "invalid_capture_time", r"^capture_time: expected a timestamp"),
        (lambda t: setattr(t, "nanos", -5), "invalid_capture_time", r"^capture_time.nanos: expected 0-999999999"),
    ],
)  # fmt: skip
def test_capture_times_outside_the_window_are_refused_with_the_reason(clocked, bundle, set_time, reason, match):
    msg = _msg(bundle, capture_time=NOW)
    set_time(msg.capture_time)
    with pytest.raises(Rejection, match=match) as e:
        clocked.validate(msg)
    assert e.value.reason == reason


def test_an_unset_capture_time_is_refused(clocked, bundle):
    msg = _msg(bundle, capture_time=NOW)
    msg.ClearField("capture_time")
    with pytest.raises(Rejection, match=r"^capture_time: expected the capture time, received none") as e:
        clocked.validate(msg)
    assert e.value.reason == "invalid_capture_time"


def test_the_default_window_lets_a_spool_deliver_after_a_long_outage(validator, bundle):
    import time

    validator.validate(_msg(bundle, capture_time=time.time() - 29 * 86400))  # four weeks in the spool
    validator.validate(_msg(bundle, capture_time=time.time() + 60))  # a device clock a minute fast


# --------------------------------------------------------------------------- soft traits


def test_unbounded_soft_traits_are_refused_at_ingest(validator, bundle):
    msg = _msg(bundle)
    msg.soft_traits.add(kind=wire.SOFT_TRAITS["age"], value=1e300, epsilon=1.0, mechanism="bounded-laplace")
    with pytest.raises(Rejection, match=r"^soft_traits\[0\]\.value: expected age within") as e:
        validator.validate(msg)
    assert e.value.reason == "invalid_soft_traits"
    msg = _msg(bundle)
    msg.soft_traits.add(kind=wire.SOFT_TRAITS["age"], value=30.0, epsilon=1e-300, mechanism="m" * 5000)
    with pytest.raises(Rejection, match=r"^soft_traits\[0\]\.mechanism: .* \(5000 characters\)$") as e:
        validator.validate(msg)
    assert e.value.reason == "invalid_soft_traits" and len(str(e.value)) < 200
