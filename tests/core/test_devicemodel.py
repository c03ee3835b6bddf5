"""Signed device models: built, verified, and refused by name when they are not for this device."""

from __future__ import annotations

import json

import numpy as np
import pytest
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from peep.core import wire
from peep.core.bundle import generate_keypair
from peep.core.devicemodel import (
    CALIBRATION,
    CLASS_KEY,
    MANIFEST,
    MODEL,
    SIGNATURE,
    DeviceModelError,
    build_device_model_files,
    class_id,
    class_key_file,
    verify_device_model_files,
)
from peep.core.exceptions import WireError


def _key():
    return load_pem_private_key(generate_keypair()[0], password=None)


KEY = _key()
SUBJECTS = ["alice", "bob", ""]


def _files(key=KEY, **kw):
    args = dict(
        onnx=b"onnx-bytes",
        calibration=np.random.default_rng(0).standard_normal((40, 8)).astype(np.float32),
        subjects=SUBJECTS,
        background_index=2,
        serial=7,
        model_version="v0003",
        bundle_id="eb-0123456789abcdef0123",
        key_id="sk-0011223344556677",
        n_components=8,
        trained_at=1_700_000_000.0,
        signing_key=key,
        erased=["bob"],
    )
    args.update(kw)
    return build_device_model_files(**args)


CLASS = bytes(range(16))  # the version's class key, as the server keeps it


def test_a_model_for_this_device_verifies_and_lists_no_subject_name():
    files = _files(class_key=CLASS)
    m = verify_device_model_files(
        files, KEY.public_key(), bundle_id="eb-0123456789abcdef0123", key_id="sk-0011223344556677", newer_than=6
    )
    assert m.serial == 7 and m.calibration.shape == (40, 8) and m.n_components == 8
    blob = b"".join(files.values())
    assert b"alice" not in blob and b"bob" not in blob and CLASS.hex().encode() not in blob
    # As the broker carries it, without the class key: no claim maps to a column.
    assert m.class_key is None and m.column_of("alice") == -1
    # As a door receives it (GetDeviceModel), with the key beside the four files.
    door = verify_device_model_files(files | class_key_file(CLASS), KEY.public_key())
    assert door.class_key == CLASS and door.column_of("alice") == 0
    assert door.column_of("bob") == -1  # erased since training: never accepted
    assert door.column_of("mallory") == -1
    assert door.known.tolist() == [0]
    assert door.classes[0] == class_id(CLASS, "alice")


@pytest.mark.parametrize("key_file", [class_key_file(bytes(16)), {CLASS_KEY: b"not hex"}])
def test_a_class_key_the_signed_manifest_does_not_name_is_refused(key_file):
    with pytest.raises(DeviceModelError, match="class.key") as e:
        verify_device_model_files(_files(class_key=CLASS) | key_file, KEY.public_key())
    assert e.value.field == "class_key"


def test_a_listener_with_the_model_and_5000_candidate_names_names_no_one():
    """What a listener of the broker's model topic (or a camera's disk) holds: the four signed files.

    Tried: 5,000 candidate names, the 10 enrolled and 2 erased among them, each as the HMAC-SHA256 class id
    under every key the files could offer (each manifest string and number, each hash, the signature, the
    empty key) and as a bare SHA-256 (a keyless hash). By chance a 96-bit id matches a wrong name with
    probability 5,000 x 12 / 2^96; none matched. With the version's class key, all twelve are found.
    """
    import hashlib

    candidates = [f"Person_{i:04d}_{'ABCDEFGHIJ'[i % 10]}" for i in range(5000)]
    enrolled, erased = candidates[100:1100:100], [candidates[4321], candidates[17]]
    files = _files(subjects=[*enrolled, *erased, ""], background_index=len(enrolled) + len(erased), erased=erased,
                   class_key=CLASS)  # fmt: skip
    manifest = json.loads(files[MANIFEST])
    targets = set(manifest["classes"]) | set(manifest["erased"])
    targets.discard("")
    keys = {b""}
    for v in json.dumps(manifest).replace("{", " ").replace("}", " ").replace(",", " ").replace('"', " ").split():
        keys.add(v.strip(":").encode())
        try:
            keys.add(bytes.fromhex(v.strip(":")))
        except ValueError:
            pass
    keys.add(json.loads(files[SIGNATURE])["signature"].encode())
    keys |= {hashlib.sha256(files[n]).digest() for n in (MODEL, CALIBRATION, MANIFEST)}
    found = {n for n in candidates for k in keys if class_id(k, n) in targets}
    found |= {n for n in candidates if hashlib.sha256(n.encode()).hexdigest()[:24] in targets}
    assert found == set()
    assert {n for n in candidates if class_id(CLASS, n) in targets} == {*enrolled, *erased}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda f: f.__setitem__(MODEL, b"other"), MODEL),
        (lambda f: f.__setitem__(CALIBRATION, f[CALIBRATION][:-4] + b"\0\0\0\0"), CALIBRATION),
        (lambda f: f.__setitem__(MANIFEST, f[MANIFEST].replace(b'"serial": 7', b'"serial": 9')), "signature"),
        (lambda f: f.pop(SIGNATURE), "files"),
        (lambda f: f.__setitem__(SIGNATURE, b"{not json"), "signature"),
        (lambda f: f.__setitem__("extra.bin", b""), "files"),
    ],
)
def test_a_tampered_or_incomplete_model_is_refused_by_name(change, field):
    files = _files()
    change(files)
    with pytest.raises(DeviceModelError) as err:
        verify_device_model_files(files, KEY.public_key())
    assert err.value.field == field, str(err.value)


def test_another_key_bundle_site_key_or_an_older_serial_is_refused_by_name():
    files = _files()
    cases = [
        (dict(), _key().public_key(), "signature"),
        (dict(bundle_id="eb-ffffffffffffffffffff"), KEY.public_key(), "bundle_id"),
        (dict(key_id="sk-ffffffffffffffff"), KEY.public_key(), "key_id"),
        (dict(key_id=""), KEY.public_key(), "key_id"),
        (dict(newer_than=7), KEY.public_key(), "serial"),
        (dict(newer_than=8), KEY.public_key(), "serial"),
    ]
    for kwargs, pub, field in cases:
        with pytest.raises(DeviceModelError) as err:
            verify_device_model_files(files, pub, **kwargs)
        assert err.value.field == field, (kwargs, str(err.value))


def test_salts_make_ids_unlinkable_across_models():
    a = json.loads(_files()[MANIFEST])
    b = json.loads(_files()[MANIFEST])
    assert a["classes"][0] != b["classes"][0]


def test_bad_calibration_is_refused_when_building():
    with pytest.raises(DeviceModelError, match="calibration"):
        _files(calibration=np.zeros((3, 5), np.float32))
    with pytest.raises(DeviceModelError, match="calibration"):
        _files(calibration=np.full((3, 8), np.nan, np.float32))


def test_device_model_files_travel_as_one_message():
    files = _files()
    msg = wire.device_model_message(files, 7)
    serial, back = wire.decode_device_model(msg.SerializeToString(), max_bytes=1 << 20)
    assert serial == 7 and back == files
    with pytest.raises(WireError, match="payload"):
        wire.decode_device_model(b"\xff\xff\xff", max_bytes=1 << 20)
    with pytest.raises(WireError, match="files"):
        wire.decode_device_model(msg.SerializeToString(), max_bytes=100)


def _decision(**kw):
    args = dict(
        device_id="cam-1",
        site="hq",
        bundle_id="eb-0123456789abcdef0123",
        key_id="sk-0011223344556677",
        model_serial=7,
        model_version="v0003",
        purpose="identify",
        label="0" * 24,
        epsilon_label=8.0,
        labels=11,
        track_id="t1",
    )
    args.update(kw)
    return wire.make_decision(**args)


def test_a_decision_carries_no_template_and_round_trips():
    msg = _decision()
    back = wire.decode_template(wire.encode_template(msg))
    assert back.decision.label == "0" * 24 and len(back.values) == 0 and not back.HasField("mechanism")
    door = _decision(purpose="verify", label="", subject="alice", accepted=True)
    assert wire.decode_template(wire.encode_template(door)).decision.accepted


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(label="Alice"), "decision.label"),
        (dict(epsilon_label=0.0), "decision.epsilon_label"),
        (dict(epsilon_label=float("nan")), "decision.epsilon_label"),
        (dict(labels=1), "decision.labels"),
        (dict(model_serial=0), "decision.model_serial"),
        (dict(frames_fused=0), "decision.frames_fused"),
        (dict(purpose="enroll"), "purpose"),
        (dict(purpose="verify", label="", subject=""), "subject"),
    ],
)
def test_bad_decisions_are_refused_by_name(kw, field):
    with pytest.raises(WireError, match=field):
        _decision(**kw)


def test_a_decision_with_a_template_beside_it_is_refused():
    msg = _decision()
    msg.values.extend([0.5] * 8)
    with pytest.raises(WireError, match="decision"):
        wire.validate_template(msg)
    door = _decision(purpose="verify", label="", subject="alice")
    door.decision.label = "0" * 24
    with pytest.raises(WireError, match="decision.label"):
        wire.validate_template(door)


def test_a_model_expires_and_says_when():
    files = _files(issued_at=1000.0, valid_s=60.0)
    m = verify_device_model_files(files, KEY.public_key())
    assert m.expires_at == 1060.0
    assert not m.expired(now=1059.0) and m.expired(now=1060.0)
    with pytest.raises(DeviceModelError, match="valid_s"):
        _files(valid_s=0)


def test_calibration_people_weigh_the_same_whatever_their_photos():
    files = _files(calibration_groups=[0] * 30 + list(range(1, 11)))
    m = verify_device_model_files(files, KEY.public_key())
    w = m.calibration_weights
    assert w[:30].sum() == pytest.approx(1.0) and np.all(w[30:] == 1.0)
    assert np.all(verify_device_model_files(_files(), KEY.public_key()).calibration_weights == 1.0)
    with pytest.raises(DeviceModelError, match="calibration_groups"):
        _files(calibration_groups=[0, 1])
