"""Decision mode on the device: a model trained only on perturbed releases, run on clean projections."""

from __future__ import annotations

import io

import numpy as np
import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from peep.core import features
from peep.core.bundle import generate_keypair
from peep.core.devicemodel import MANIFEST, build_device_model_files, class_id, class_key_file
from peep.core.mechanisms.registry import make_mechanism
from peep.core.sitekey import SiteKey
from peep.edge.decide import DecisionSource, DeviceDecider, ModelStore, NoDeviceModel, fuse_projections
from peep.server.recognition.export import export_onnx
from peep.server.recognition.fitting import fit_recogniser

K = 16
#: The version's class key the rig's models are made under (a door holds it).
CLASS_KEY_BYTES = bytes(range(16))
BUNDLE = "eb-0123456789abcdef0123"


def _unit(X):
    return X / np.linalg.norm(X, axis=1, keepdims=True)


class World:
    """People on the unit sphere: each a direction plus within-person spread (what projections of photos are)."""

    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)

    def person(self, n):
        centre = _unit(self.rng.standard_normal((1, K)))
        return _unit(centre + 0.5 * self.rng.standard_normal((n, K)) / np.sqrt(K))


@pytest.fixture(scope="module")
def rig():
    world = World(0)
    key = SiteKey(bytes(range(32)))
    enrolled = {f"p{i}": world.person(26) for i in range(6)}
    background = [world.person(6) for _ in range(60)]
    public = np.vstack([world.person(3) for _ in range(150)])
    strangers = np.vstack([world.person(1) for _ in range(200)])
    with features.enabled("seeded-noise"):
        mech = make_mechanism("privunit", epsilon=16.0, n_components=K, random_state=1)
        X, subjects = [], []
        for name, faces in enrolled.items():
            X.append(mech.release(key.apply(faces[:20])))
            subjects += [name] * 20
        for b, faces in enumerate(background):
            X.append(mech.release(key.apply(faces)))
            subjects += [f"background:{b}"] * len(faces)
    fitted = fit_recogniser(np.vstack(X).astype(np.float32), subjects, preset="lda", target_far=0.01)
    onnx = export_onnx(fitted, K)
    signer = load_pem_private_key(generate_keypair()[0], password=None)
    files = build_device_model_files(
        onnx=onnx, calibration=public.astype(np.float32), subjects=fitted.class_names,
        background_index=fitted.background_index, serial=5, model_version="v0001", bundle_id=BUNDLE,
        key_id=key.key_id, n_components=K, trained_at=1.0, signing_key=signer, fpir=0.01, far=0.001,
        extra={"domain": "unit"}, class_key=CLASS_KEY_BYTES,
    ) | class_key_file(CLASS_KEY_BYTES)  # fmt: skip  # as a door receives it (GetDeviceModel)
    probes = {n: f[20:] for n, f in enrolled.items()}
    return dict(key=key, files=files, signer=signer, probes=probes, strangers=strangers, fitted=fitted)


def _store(tmp_path, rig, **kw):
    store = ModelStore(tmp_path / "m", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id, **kw)
    assert store.offer(rig["files"], source="test") is not None
    return store


def _decider(tmp_path, rig, **kw):
    store = _store(tmp_path, rig)
    return DeviceDecider(store.current, domain="unit", site_key=rig["key"], **kw)


def test_the_device_names_enrolled_people_and_rejects_strangers_on_clean_projections(tmp_path, rig):
    d = _decider(tmp_path, rig, epsilon_label=None)
    model = d.model
    named = wrong = 0
    total = 0
    for name, faces in rig["probes"].items():
        P = d.probabilities(faces)
        for row in P:
            total += 1
            best = d.known[np.argmax(row[d.known])]
            if row[best] >= d.thresholds.unknown_threshold:
                if model.classes[best] == model.classes[model.column_of(name)]:
                    named += 1
                else:
                    wrong += 1
    P = d.probabilities(rig["strangers"])
    fpir = float(np.mean(P[:, d.known].max(axis=1) >= d.thresholds.unknown_threshold))
    assert named / total >= 0.9, (named, total)
    assert fpir <= 0.03  # calibrated at 1 % on other public people


def test_a_claim_is_decided_on_the_device(tmp_path, rig):
    d = _decider(tmp_path, rig, epsilon_label=None)
    alice, bob = "p0", "p1"
    genuine = [d.verify(f[None], alice).accepted for f in rig["probes"][alice]]
    impostor = [d.verify(f[None], alice).accepted for f in rig["probes"][bob]]
    assert np.mean(genuine) >= 0.8 and not any(impostor)
    assert not d.verify(rig["probes"][alice][:1], "mallory").known


def _files(rig, **kw):
    args = dict(
        onnx=rig["files"]["model.onnx"], calibration=np.load(io.BytesIO(rig["files"]["calibration.npy"])),
        subjects=rig["fitted"].class_names, background_index=rig["fitted"].background_index, serial=6,
        model_version="v0001", bundle_id=BUNDLE, key_id=rig["key"].key_id, n_components=K, trained_at=1.0,
        signing_key=rig["signer"], class_key=CLASS_KEY_BYTES,
    )  # fmt: skip
    args.update(kw)
    return build_device_model_files(**args) | class_key_file(args["class_key"])


def test_an_epsilon_label_too_small_for_the_fpir_target_refuses_to_decide(tmp_path, rig):
    """Below the labels' FPIR floor the device refuses by name (enrolled count, ε_label, floor, the ε that
    would do), reports why, and decides as soon as ε_label allows the target."""
    from peep.core.reports import DeviceReport, parse_device_report
    from peep.edge.decide import FpirBelowFloor

    store = _store(tmp_path, rig)
    enrolled = int(store.current.known.size)
    with pytest.raises(FpirBelowFloor) as caught:
        DeviceDecider(store.current, domain="unit", site_key=rig["key"], epsilon_label=1.0)
    err = caught.value
    assert err.enrolled == enrolled and err.epsilon_label == 1.0 and err.target == store.current.fpir
    # k-RR over enrolled + 1 outputs: a stranger called unknown is named with n / (e^ε + n).
    assert err.floor == pytest.approx(enrolled / (np.e + enrolled), rel=1e-9)
    text = str(err)
    assert f"{enrolled} enrolled subjects at epsilon_label 1" in text and f"{err.floor:.4g}" in text
    assert "[recognition] epsilon_label to about" in text
    source = DecisionSource(store, domain="unit", site_key=rig["key"], epsilon_label=1.0)
    assert source.decider() is None and "FPIR floor" in source.problem
    # The refusal reaches the server in the device report, bounded.
    report = DeviceReport(at=1.0, bundle_id=BUNDLE, mechanism="privunit", epsilon_vector=8.0, epsilon_coordinate=8.0,
                          epsilon_vector_per_release=1.0, track_budget_vector=None, device_budget_vector=None,
                          releases=0, epsilon_vector_spent=0.0,
                          decision={k: source.describe().get(k)
                                    for k in ("mode", "model_serial", "problem", "epsilon_label")})  # fmt: skip
    assert "FPIR floor" in parse_device_report(report.to_json()).decision["problem"]
    # The ε the message asks for decides, and says its floor and target.
    need = float(text.split("epsilon_label to about ")[1].split(" ")[0])
    d = DeviceDecider(store.current, domain="unit", site_key=rig["key"], epsilon_label=need + 0.1)
    described = d.describe()
    assert described["fpir_floor"] < described["fpir_target"] == store.current.fpir
    assert described["fpir_floor"] <= described["fpir_floor_bound"] <= 2 * described["fpir_floor"]


def test_the_label_is_randomised_at_epsilon_label_and_only_opaque_ids_leave(tmp_path, rig):
    # A lenient FPIR target, so that ε 1 (which names a stranger 6 times in 9) may decide at all.
    store = _store(tmp_path, rig)
    store.offer(_files(rig, fpir=0.9), source="test")
    with features.enabled("seeded-noise"):
        d = DeviceDecider(store.current, domain="unit", site_key=rig["key"], epsilon_label=1.0, random_state=3)
    labels = [d.identify(rig["probes"]["p0"][:1]).label for _ in range(300)]
    true_id = d.model.classes[d.model.column_of("p0")]
    keep = np.mean([lab == true_id for lab in labels])
    # k-RR over 7 outputs at ε 1: kept with e/(e+6) ≈ 0.31 (if the model names p0 on this probe)
    assert 0.2 < keep < 0.45
    assert all(lab == "" or lab in d.model.classes for lab in labels)
    assert all("p0" not in lab for lab in labels)


def test_erased_subjects_are_never_named_nor_accepted(tmp_path, rig):
    files = _files(rig, erased=["p0"])
    store = _store(tmp_path, rig)
    assert store.offer(files, source="test").serial == 6
    d = DeviceDecider(store.current, domain="unit", site_key=rig["key"], epsilon_label=None)
    P = d.probabilities(rig["probes"]["p0"])
    assert np.all(P[:, d.model.classes.index(class_id(d.model.class_key, "p0"))] == 0)
    assert not any(d.verify(f[None], "p0").accepted for f in rig["probes"]["p0"])


def test_the_store_keeps_the_previous_model_and_takes_only_newer_ones(tmp_path, rig):
    store = _store(tmp_path, rig)
    assert store.offer(rig["files"], source="again") is None  # the same serial: nothing to do
    tampered = dict(rig["files"])
    tampered[MANIFEST] = tampered[MANIFEST].replace(b'"serial": 5', b'"serial": 50')
    assert store.offer(tampered, source="mqtt") is None and store.refused == 1 and store.refusals == {"signature": 1}
    assert "signature" in store.last_refusal
    # A restart reads the held model back, and falls back to the previous one if the current is damaged.
    again = ModelStore(tmp_path / "m", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id)
    assert again.load().serial == 5
    other = ModelStore(tmp_path / "m", rig["signer"].public_key(), bundle_id=BUNDLE, key_id="sk-ffffffffffffffff")
    assert other.load() is None  # a model for another site key is never used


def test_without_a_valid_model_nothing_decides(tmp_path, rig):
    now = [1e12]
    store = ModelStore(tmp_path / "m", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id,
                       clock=lambda: now[0])  # fmt: skip
    assert store.offer(rig["files"], source="test") is None  # expired already at that clock
    source = DecisionSource(store, domain="unit", site_key=rig["key"], epsilon_label=8.0)
    assert source.decider() is None and source.describe()["model_serial"] is None
    with pytest.raises(NoDeviceModel, match="domain"):
        DeviceDecider(_store(tmp_path / "x", rig).current, domain="scaled", site_key=None, epsilon_label=None)


def test_fusing_frames_stays_on_the_sphere():
    U = _unit(np.random.default_rng(0).standard_normal((3, K)))
    f = fuse_projections(U, "unit")
    assert abs(np.linalg.norm(f) - 1) < 1e-12
    with pytest.raises(ValueError, match="bounded"):
        fuse_projections(np.full((2, K), np.nan), "unit")


def test_a_camera_fuses_the_largest_faces_it_looked_at_and_waits_for_them(tmp_path):
    from peep.edge.config import RecognitionConfig
    from peep.edge.pipeline import largest_faces

    # (face height, projection) in frame order: the person walks nearer, turns away, comes back.
    seen = [(40.0, "a"), (90.0, "b"), (60.0, "c"), (90.0, "d"), (120.0, "e"), (30.0, "f")]
    assert largest_faces(seen, 3) == ["b", "d", "e"]  # frame order kept
    assert largest_faces(seen, 2) == ["d", "e"]  # of the two 90s, the later
    assert largest_faces(seen, 10) == ["a", "b", "c", "d", "e", "f"]
    assert largest_faces(seen, 0) == []
    with pytest.raises(ValueError, match=r"recognition.choose_from: expected >= fuse_frames \(4\), received 3"):
        RecognitionConfig(fuse_frames=4, choose_from=3)
    cfg = RecognitionConfig(fuse_frames=3, choose_from=8)
    assert cfg.frames_looked_at == 8 and RecognitionConfig(fuse_frames=3).frames_looked_at == 3
    store = ModelStore(tmp_path / "none", None, bundle_id="b", key_id="k")  # no model held
    assert DecisionSource(store, domain="unit", site_key=None, epsilon_label=8.0, fuse_frames=cfg.fuse_frames,
                          choose_from=cfg.choose_from).choose_from == 8  # fmt: skip
    assert DecisionSource(store, domain="unit", site_key=None, epsilon_label=8.0, fuse_frames=3).choose_from == 3


def _erased_person_is_accepted(store, rig) -> bool:
    d = DeviceDecider(store.current, domain="unit", site_key=rig["key"], epsilon_label=None)
    return any(d.verify(f[None], "p0").accepted for f in rig["probes"]["p0"])


def test_a_pre_erasure_model_copied_into_current_does_not_bring_the_erased_person_back(tmp_path, rig):
    """The attack: the genuine model of before the erasure (serial 5) written over ``current/``, the server away."""
    import shutil

    before = tmp_path / "before"
    store = _store(tmp_path, rig)  # serial 5: p0 enrolled and accepted
    assert _erased_person_is_accepted(store, rig)
    shutil.copytree(tmp_path / "m" / "current", before)
    assert store.offer(_files(rig, erased=["p0"]), source="test").serial == 6  # p0 erased
    assert not _erased_person_is_accepted(store, rig)
    shutil.rmtree(tmp_path / "m" / "current")
    shutil.copytree(before, tmp_path / "m" / "current")
    again = ModelStore(tmp_path / "m", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id)
    assert again.load() is None  # neither current (5, copied) nor previous (5) is at the floor (6)
    assert again.erasure_floor() == 6
    # ... nor is the old model taken when it is offered again (replayed on the broker).
    assert again.offer(rig["files"], source="mqtt") is None and again.refusals == {"erasure_floor": 1}
    assert "expected 6 or later (the newest erasure this device has heard of), received 5" in again.last_refusal
    # The server's next model is taken.
    assert again.offer(_files(rig, erased=["p0"], serial=7), source="grpc").serial == 7


def test_a_corrupt_current_falls_back_only_to_a_previous_that_knew_every_erasure(tmp_path, rig):
    salt = bytes(16)  # one version's class key, as the server keeps it: a re-issue has the same ids
    store = ModelStore(tmp_path / "m", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id)
    store.offer(_files(rig, serial=5, class_key=salt), source="test")
    store.offer(_files(rig, erased=["p0"], class_key=salt), source="test")  # 6: an erasure, the floor
    store.offer(_files(rig, erased=["p0"], serial=7, class_key=salt), source="test")  # 7: a re-issue of 6
    assert store.erasure_floor() == 6
    (tmp_path / "m" / "current" / MANIFEST).write_bytes(b"{ damaged")
    again = ModelStore(tmp_path / "m", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id)
    assert again.load().serial == 6 and not _erased_person_is_accepted(again, rig)  # the previous, erasure known
    # One more erasure (8), then a damaged current: its previous (7) predates it and is not used.
    again.offer(_files(rig, erased=["p0", "p1"], serial=8, class_key=salt), source="test")
    assert again.erasure_floor() == 8
    (tmp_path / "m" / "current" / MANIFEST).write_bytes(b"{ damaged")
    third = ModelStore(tmp_path / "m", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id)
    assert third.load() is None
    # A damaged floor file: only the newest stored model that verifies may serve, not its previous.
    fresh = ModelStore(tmp_path / "n", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id)
    fresh.offer(_files(rig, serial=5, class_key=salt), source="test")
    fresh.offer(_files(rig, serial=6, class_key=salt), source="test")  # a re-issue: the floor stays at 5
    assert fresh.erasure_floor() == 5
    (tmp_path / "n" / "erasure-floor").write_text("garbage")
    fourth = ModelStore(tmp_path / "n", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id)
    assert fourth.erasure_floor() == 6 and fourth.load().serial == 6


def test_a_door_takes_a_model_only_with_its_class_key_and_keeps_the_key_to_itself(tmp_path, rig):
    """The broker's copy has no class key (ids name no one without it): a door refuses it, takes the one an
    authenticated GetDeviceModel call hands it (with ``class.key``), and stores the key readable by itself only."""
    from peep.core.devicemodel import CLASS_KEY

    door = ModelStore(tmp_path / "d", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id,
                      needs_class_key=True)  # fmt: skip
    broadcast = {k: v for k, v in _files(rig).items() if k != CLASS_KEY}
    assert door.offer(broadcast, source="mqtt") is None and door.refusals == {"class_key": 1}
    held = door.offer(_files(rig), source="grpc")
    assert held is not None and held.class_key == CLASS_KEY_BYTES and held.column_of("p0") >= 0
    stored = tmp_path / "d" / "current" / CLASS_KEY
    assert stored.stat().st_mode & 0o777 == 0o600
    assert ModelStore(tmp_path / "d", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id,
                      needs_class_key=True).load().class_key == CLASS_KEY_BYTES  # fmt: skip
    # A camera takes the broadcast: its labels are the same ids, which the server alone maps to names.
    camera = ModelStore(tmp_path / "c", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id)
    taken = camera.offer(broadcast, source="mqtt")
    assert taken is not None and taken.class_key is None and taken.column_of("p0") == -1
    stored.unlink()  # a stored model whose key was lost: the door does not decide with it
    assert ModelStore(tmp_path / "d", rig["signer"].public_key(), bundle_id=BUNDLE, key_id=rig["key"].key_id,
                      needs_class_key=True).load() is None  # fmt: skip


def test_a_calibration_set_too_small_for_its_target_says_so(tmp_path, rig, caplog):
    """450 public faces resolve a 1 % target to 1.1 % (quiet) but a 0.5 % target only to 0.67 %: the device
    says how many people the target needs, and reports how many it had."""
    import logging

    with caplog.at_level(logging.WARNING, logger="peep.edge.decide"):
        d = _decider(tmp_path / "a", rig, epsilon_label=None)
    assert d.calibration_people == 450 and not [
        r for r in caplog.records if "calibration_set_too_small" in r.getMessage()
    ]
    assert d.describe()["fpir_model_resolved"] == pytest.approx((4 + 1) / 451)
    store = _store(tmp_path / "b", rig)
    assert store.offer(_files(rig, fpir=0.005), source="test").serial == 6
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="peep.edge.decide"):
        d = DeviceDecider(store.current, domain="unit", site_key=rig["key"], epsilon_label=None)
    from peep.core.logs import _FIELDS

    warned = [getattr(r, _FIELDS)["error"] for r in caplog.records if r.getMessage() == "calibration_set_too_small"]
    assert warned and "450 public people" in warned[0] and "about 1000 are needed" in warned[0]
    assert d.fpir_resolved == pytest.approx(3 / 451)
