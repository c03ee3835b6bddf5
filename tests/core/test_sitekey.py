"""Site keys: derivation is deterministic and Haar, files are private, nothing leaks the secret."""

from __future__ import annotations

import os

import numpy as np
import pytest
from peep.core.sitekey import KEY_BYTES, SiteKey, SiteKeyError, hkdf_sha256


def test_hkdf_matches_rfc5869_test_case_1():
    ikm = bytes.fromhex("0b" * 22)
    salt = bytes.fromhex("000102030405060708090a0b0c")
    info = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9")
    okm = hkdf_sha256(ikm, info, 42, salt=salt)
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865")


def test_the_same_key_gives_the_same_rotation_and_another_key_another():
    secret = bytes(range(KEY_BYTES))
    a, b, other = SiteKey(secret), SiteKey(secret), SiteKey(bytes(reversed(range(KEY_BYTES))))
    np.testing.assert_array_equal(a.rotation(16), b.rotation(16))
    assert a.key_id == b.key_id and a.key_id != other.key_id and a.key_id.startswith("sk-")
    assert np.abs(a.rotation(16) - other.rotation(16)).max() > 0.1
    q = a.rotation(16)
    np.testing.assert_allclose(q @ q.T, np.eye(16), atol=1e-12)
    # Each dimension has its own matrix, not a block of another's.
    assert not np.allclose(a.rotation(8), a.rotation(16)[:8, :8])
    assert secret.hex() not in repr(a) and a.key_id in repr(a)


def test_rotations_are_haar_distributed():
    """Over many keys, Q e_1 is uniform on the sphere and det Q is ±1 with equal chance (Haar on O(K))."""
    k, n = 4, 4000
    rng = np.random.default_rng(0)
    firsts, dets = [], []
    for _ in range(n):
        q = SiteKey(rng.bytes(KEY_BYTES)).rotation(k)
        firsts.append(q[:, 0])
        dets.append(np.linalg.det(q))
    firsts_arr = np.asarray(firsts)
    # Uniform on S^3: mean 0, second moment I/4 (sd of each entry of the mean ≈ 0.5/sqrt(n) = 0.008).
    np.testing.assert_allclose(firsts_arr.mean(axis=0), 0.0, atol=0.04)
    np.testing.assert_allclose(firsts_arr.T @ firsts_arr / n, np.eye(k) / k, atol=0.03)
    assert abs(np.mean(np.sign(dets))) < 0.06
    # numpy's QR without the sign correction is not Haar: its Q[0, 0] averages -0.42 at K = 4.
    assert abs(np.mean([f[0] for f in firsts])) < 0.04


def test_key_files_are_private_and_never_overwritten(tmp_path):
    key = SiteKey.generate()
    path = key.write(tmp_path / "site.key")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert SiteKey.load(path).key_id == key.key_id
    with pytest.raises(SiteKeyError, match="exists"):
        SiteKey.generate().write(path)
    os.chmod(path, 0o644)
    with pytest.raises(SiteKeyError, match="expected mode 0600.*received 0644"):
        SiteKey.load(path)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("peep-site-key-v1:abcd\n", "64 hex digits, received 4"),
        ("peep-site-key-v1:" + "zz" * 32 + "\n", "hex digits"),
        ("ssh-ed25519 AAAA\n", "one line 'peep-site-key-v1:"),
        ("", "one line"),
    ],
)
def test_malformed_key_files_are_named(tmp_path, text, match):
    p = tmp_path / "bad.key"
    p.write_text(text)
    p.chmod(0o600)
    with pytest.raises(SiteKeyError, match=match):
        SiteKey.load(p)
    with pytest.raises(SiteKeyError, match="cannot read"):
        SiteKey.load(tmp_path / "missing.key")


@pytest.mark.parametrize(("kind", "delta"), [("privunit", None), ("privunit-g", None), ("gaussian-l2", 1e-6)])
def test_keyed_release_has_the_same_epsilon_and_the_rotated_law(bundle, lfw100, kind, delta):
    """Q^T M(Q u) has the law of M(u): the keyed release is the unkeyed one, rotated (same ε, same δ)."""
    from peep.core import features
    from peep.core.release import TemplateReleaser
    from scipy.stats import ks_2samp

    key = SiteKey(bytes(range(1, KEY_BYTES + 1)))
    with features.enabled("seeded-noise"):
        plain = TemplateReleaser(bundle, kind=kind, epsilon=8.0, delta=delta, random_state=1)
        keyed = TemplateReleaser(bundle, kind=kind, epsilon=8.0, delta=delta, random_state=2, site_key=key)
    assert keyed.mechanism.guarantee == plain.mechanism.guarantee and keyed.key_id == key.key_id
    assert plain.key_id == ""
    u = plain.project(lfw100.images[:1]).astype(np.float64)
    q = key.rotation(u.shape[1])
    n = 3000
    a = plain.release_bounded(np.repeat(u, n, axis=0)).astype(np.float64)
    raw = keyed.release_bounded(np.repeat(u, n, axis=0)).astype(np.float64)
    b = raw @ q  # row form of Q^T y
    direction = np.random.default_rng(5).standard_normal(u.shape[1])
    for stat_a, stat_b in ((a @ u[0], b @ u[0]), (a @ direction, b @ direction), (a[:, 3], b[:, 3])):
        assert ks_2samp(stat_a, stat_b).pvalue > 1e-3
    # The test can tell laws apart: the keyed release itself, not rotated back, is centred elsewhere.
    assert ks_2samp(a @ u[0], raw @ u[0]).pvalue < 1e-6


@pytest.mark.parametrize("kind", ["peep", "peep-raw", "laplace-vector", "laplace-l1"])
def test_keyed_release_is_refused_where_a_rotation_leaves_the_domain(bundle, kind):
    from peep.core.release import TemplateReleaser

    with pytest.raises(
        ValueError, match=rf"mechanism '{kind}': a site key rotates.*needs one of gaussian-l2, privunit"
    ):
        TemplateReleaser(bundle, kind=kind, epsilon=8.0, site_key=SiteKey.generate())
