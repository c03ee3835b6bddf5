from __future__ import annotations

import json
import shutil
import stat

import numpy as np
import pytest
from peep.core import bundle as bmod
from peep.core.bundle import ProjectionBundle, load_public_key, verify_bundle, write_keypair
from peep.core.exceptions import BundleError


def test_onnxruntime_and_numpy_projections_agree_on_real_faces(bundle, lfw100):
    faces = lfw100.images[:300]
    out = bundle.project(faces)
    model = bundle.model()
    ref = model.transform(faces.reshape(len(faces), -1).astype(np.float64))
    np.testing.assert_allclose(out["coefficients"], ref, atol=1e-5)
    b = bundle.bounds
    np.testing.assert_allclose(out["scaled"], b.scaler().transform(ref), atol=1e-5)
    np.testing.assert_allclose(out["box_clipped"], np.clip(ref, b.lower, b.upper), atol=1e-5)
    from peep.core.bounding import clip_l1, clip_l2

    np.testing.assert_allclose(out["l2_clipped"], clip_l2(ref, b.radius_l2), atol=1e-5)
    np.testing.assert_allclose(out["l1_clipped"], clip_l1(ref, b.radius_l1), atol=1e-4)
    assert out["scaled"].min() >= 0 and out["scaled"].max() <= 1
    assert np.linalg.norm(out["l2_clipped"], axis=1).max() <= b.radius_l2 * (1 + 1e-6)


def test_every_release_domain_is_a_projector_output_equal_to_its_numpy_form(bundle, lfw100):
    from peep.core.domains import DOMAINS
    from peep.core.projections import projector_outputs

    assert bundle.outputs == projector_outputs() == ("coefficients", *DOMAINS)
    faces = lfw100.images[:200]
    out = bundle.project(faces)
    ref = bundle.model().transform(faces.reshape(len(faces), -1).astype(np.float64))
    for name, dom in DOMAINS.items():
        np.testing.assert_allclose(out[name], dom.apply(ref, bundle.bounds), atol=1e-4, err_msg=name)
        back = dom.inverse(dom.apply(ref, bundle.bounds), bundle.bounds)
        inside = np.all((ref >= bundle.bounds.lower) & (ref <= bundle.bounds.upper), axis=1)
        if name in ("scaled", "box_clipped"):  # rescaling undone exactly inside the box
            np.testing.assert_allclose(back[inside], ref[inside], atol=1e-9, err_msg=name)


def test_bundle_reads_back_its_projection(bundle, lfw100):
    from peep.core.projections import EigenfaceProjection

    assert bundle.projection_kind == "eigenfaces" and bundle.metadata["projection"] == "eigenfaces"
    proj = bundle.projection()
    assert isinstance(proj, EigenfaceProjection)
    X = lfw100.images[:20].reshape(20, -1).astype(np.float64)
    np.testing.assert_allclose(proj.transform(X), bundle.project(lfw100.images[:20], "coefficients"), atol=1e-4)
    np.testing.assert_array_equal(proj.bounds_.lower, bundle.bounds.lower)


def test_a_mechanism_whose_domain_the_projector_lacks_is_refused(monkeypatch, keypair, lfw_background, tmp_path):
    """A bundle without the output a mechanism releases (e.g. a unit-sphere mechanism with an
    eigenface projector) is refused by name, never released from another output."""
    from peep.core import domains
    from peep.core.bundle import build_bundle_files, write_bundle_files
    from peep.core.imaging import DEFAULT_GEOMETRY
    from peep.core.projections import EigenfaceProjection
    from peep.core.projections import base as projection_base
    from peep.core.release import TemplateReleaser

    without_l1 = {k: v for k, v in domains.DOMAINS.items() if k != "l1_clipped"}
    monkeypatch.setattr(projection_base, "DOMAINS", without_l1)
    proj = EigenfaceProjection(n_components=16).fit(lfw_background.X[:200])
    files = build_bundle_files(
        projection=proj, geometry=DEFAULT_GEOMETRY, signing_key=keypair[0], normalisation={}, mechanism_defaults={}
    )
    monkeypatch.undo()
    b = ProjectionBundle.load(write_bundle_files(files, tmp_path / "b"), keypair[1])
    assert "l1_clipped" not in b.outputs
    b.check_mechanism("gaussian-l2")
    with pytest.raises(BundleError, match=r"laplace-l1.*l1_clipped.*" + b.bundle_id):
        b.check_mechanism("laplace-l1")
    with pytest.raises(BundleError, match="laplace-l1"):
        TemplateReleaser(b, kind="laplace-l1", epsilon=8.0)


def test_single_face_and_shape_errors(bundle, lfw100):
    one = bundle.project(lfw100.images[0], "scaled")
    assert one.shape == (1, 128) and one.dtype == np.float32
    with pytest.raises(ValueError, match="faces: expected shape"):
        bundle.project(np.zeros((2, 100)))
    with pytest.raises(ValueError, match="output: expected one of"):
        bundle.project(lfw100.images[:1], "pixels")


def test_metadata_describes_the_bundle(bundle):
    md = bundle.metadata
    assert md["n_components"] == 128 and md["geometry"]["width"] == 47
    assert md["normalisation"]["detector"] == "HaarFaceDetector"
    assert md["provenance"]["dataset"] == "lfw"
    assert bundle.bundle_id.startswith("eb-")


@pytest.mark.parametrize("name", bmod.BUNDLE_FILES)
@pytest.mark.parametrize("where", ["start", "middle", "end"])
def test_changing_any_byte_of_any_file_fails_naming_the_file(bundle_dir, keypair, tmp_path, name, where):
    d = tmp_path / "b"
    shutil.copytree(bundle_dir, d)
    data = bytearray((d / name).read_bytes())
    i = {"start": 0, "middle": len(data) // 2, "end": len(data) - 2}[where]
    data[i] ^= 0x01
    (d / name).write_bytes(bytes(data))
    with pytest.raises(BundleError) as info:
        ProjectionBundle.load(d, keypair[1])
    assert name in str(info.value)


def test_missing_signature_and_wrong_key(bundle_dir, tmp_path):
    d = tmp_path / "b"
    shutil.copytree(bundle_dir, d)
    _, other_pub = write_keypair(tmp_path / "other")
    with pytest.raises(BundleError, match="signature.sig: Ed25519 signature does not verify"):
        verify_bundle(d, load_public_key(other_pub))
    (d / "signature.sig").unlink()
    with pytest.raises(BundleError, match="signature.sig: missing"):
        verify_bundle(d, load_public_key(other_pub))


def test_resigned_manifest_with_swapped_projector_is_caught(bundle_dir, keypair, tmp_path):
    """An attacker with the key could re-sign; without it, a consistent-looking swap still fails."""
    d = tmp_path / "b"
    shutil.copytree(bundle_dir, d)
    manifest = json.loads((d / "manifest.json").read_text())
    manifest["files"]["projector.onnx"] = "0" * 64
    (d / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="manifest.json"):
        verify_bundle(d, keypair[1])


def test_files_roundtrip_in_memory(bundle, keypair):
    again = ProjectionBundle.from_files(bundle.files, keypair[1])
    assert again.bundle_id == bundle.bundle_id
    with pytest.raises(BundleError, match="projector.onnx: missing"):
        ProjectionBundle.from_files({k: v for k, v in bundle.files.items() if k != "projector.onnx"}, keypair[1])


def test_keypair_files(tmp_path):
    key, pub = write_keypair(tmp_path / "k" / "site")
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert pub.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    with pytest.raises(FileExistsError, match="refusing to overwrite"):
        write_keypair(tmp_path / "k" / "site")
    with pytest.raises(BundleError, match="Ed25519 private key"):
        bmod.load_private_key(pub)
