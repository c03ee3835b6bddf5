"""The claim checker's rules on its own (the RPC and the MQTT answer are tested against a real server)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from peep.server.recognition.claims import ClaimChecker, ClaimChecksTooFrequent
from peep.server.recognition.recogniser import ModelUnavailable


class FakeRecogniser:
    def __init__(self, classes, masked=()):
        self.model = SimpleNamespace(class_index={c: i for i, c in enumerate(classes)}, version="v000007")
        self.masked = set(masked)

    def require_model(self):
        if self.model is None:
            raise ModelUnavailable("no model has been trained yet")
        return self.model

    def is_masked(self, subject, model):
        return subject in self.masked


def test_known_means_enrolled_not_background_and_not_erased_since():
    rec = FakeRecogniser(["alice", "bob", "background:"], masked=["bob"])
    checker = ClaimChecker(rec, background_prefix="background:")
    assert [checker.check("door-1", s).known for s in ("alice", "bob", "background:", "carol")] == [
        True, False, False, False,
    ]  # fmt: skip
    assert checker.check("door-1", "alice").model_version == "v000007"
    rec.model = None
    with pytest.raises(ModelUnavailable):
        checker.check("door-1", "alice")


def test_each_device_has_its_own_bucket_which_refills():
    now = [0.0]
    checker = ClaimChecker(FakeRecogniser(["alice"]), rate_per_s=2.0, burst=3, clock=lambda: now[0])
    for _ in range(3):
        checker.check("door-1", "alice")
    with pytest.raises(ClaimChecksTooFrequent, match="at most 2 a second .* from 'door-1'"):
        checker.check("door-1", "alice")
    checker.check("door-2", "alice")  # another device is not held up
    now[0] += 0.5  # one token back
    checker.check("door-1", "alice")
    with pytest.raises(ClaimChecksTooFrequent):
        checker.check("door-1", "alice")


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="rate_per_s, burst"):
        ClaimChecker(FakeRecogniser([]), rate_per_s=0)


def test_the_servers_claim_check_rate_comes_from_its_configuration(tmp_path, keypair):
    from peep.server.config import parse_config
    from peep.server.services import Services

    def services(recognition: dict) -> Services:
        cfg = {"storage": {"backend": "sqlite", "path": str(tmp_path / f"{len(recognition)}.db")},
               "bundle": {"public_key": str(keypair[3])},
               "auth": {"allow_insecure": True}, "mqtt": {"enabled": False},
               "training": {"model_dir": str(tmp_path / "models")}, "recognition": recognition}  # fmt: skip
        return Services(parse_config(cfg))

    s = services({})
    assert (s.claim_checks.rate_per_s, s.claim_checks.burst) == (5.0, 20.0)  # the defaults a site runs with
    s.close()
    s = services({"claim_checks_per_s": 250.0, "claim_checks_burst": 400})
    assert (s.claim_checks.rate_per_s, s.claim_checks.burst) == (250.0, 400.0)
    s.close()
    with pytest.raises(ValueError, match="claim_checks_per_s"):
        parse_config(
            {
                "recognition": {"claim_checks_per_s": 0},
                "bundle": {"public_key": str(keypair[3])},
                "auth": {"allow_insecure": True},
            }
        )
