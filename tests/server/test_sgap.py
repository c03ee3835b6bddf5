"""SGAP: the networks, the training loop on a few dozen background faces, the ONNX
export against torch, the SSIM constraint, the CLI, and the runtime without torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# The `sgap` extra (scripts/bootstrap.sh installs it): without torch this module fails, it is not skipped.
import torch
from peep.lab.sgap.config import SgapConfig, check_background
from peep.lab.sgap.model import Generator, SiameseDiscriminator, ssim
from peep.lab.sgap.runtime import SgapModelError, SgapPrivatizer, ssim_per_face
from peep.lab.sgap.train import sample_pairs, train_sgap, write_model

LAMBDA = 0.2


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a busy 2-core machine (CI, or the suite beside other work) torch's default
    of one thread per core spins and runs ~10x slower than one thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _small(ds, n_people: int = 8, per_person: int = 5):
    """A few dozen faces: the first people of the background population, a few images each."""
    keep = np.zeros(ds.n_images, dtype=bool)
    for p in range(n_people):
        keep[np.flatnonzero(ds.labels == p)[:per_person]] = True
    return ds.images[keep], ds.labels[keep]


@pytest.fixture(scope="module")
def small(lfw_background):
    return _small(lfw_background)


@pytest.fixture(scope="module")
def trained(small, tmp_path_factory):
    images, labels = small
    out = tmp_path_factory.mktemp("sgap")
    cfg = SgapConfig(lam=LAMBDA, epochs=2, pretrain_epochs=2, batch_size=16, seed=3)
    result = train_sgap(images, labels, cfg, checkpoint_dir=out)
    report = write_model(result, images, labels, out, {"dataset": "lfw", "min_faces": 5, "max_faces": 9})
    return result, report, out


@pytest.fixture(scope="module")
def sweep(trained, small, tmp_path_factory):
    """A λ sweep's folder as 'peep sgap train --lambda 0.2,0.3' lays it out: lambda-L/sgap.onnx each."""
    import shutil

    images, labels = small
    out = tmp_path_factory.mktemp("sweep")
    shutil.copytree(trained[2], out / f"lambda-{LAMBDA:g}")
    cfg = SgapConfig(lam=0.3, epochs=1, pretrain_epochs=1, batch_size=16, seed=4)
    result = train_sgap(images, labels, cfg)
    write_model(result, images, labels, out / "lambda-0.3", {"dataset": "lfw", "min_faces": 5, "max_faces": 9})
    return out


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"lam": 0.0}, ValueError, r"lambda: expected a number in \(0.0, 1.0\), received 0.0"),
        ({"lam": 1.0}, ValueError, r"lambda: .* received 1.0"),
        ({"lam": float("nan")}, ValueError, r"lambda: .* received nan"),
        ({"lam": "0.1"}, TypeError, r"lambda: expected a number, received str '0.1'"),
        ({"lam": 0.1, "epochs": 0}, ValueError, r"epochs: expected an int >= 1, received 0"),
        ({"lam": 0.1, "epochs": 2.0}, TypeError, r"epochs: expected an int, received float"),
        ({"lam": 0.1, "batch_size": 1}, ValueError, r"batch_size: expected an int >= 2, received 1"),
        ({"lam": 0.1, "beta1": 1.0}, ValueError, r"beta1: .* received 1.0"),
        ({"lam": 0.1, "lr_generator": 0}, ValueError, r"lr_generator: .* received 0"),
        ({"lam": 0.05, "slack": 0.05}, ValueError, r"slack: expected < lambda \(0.05\), received 0.05"),
        ({"lam": 0.1, "seed": -1}, ValueError, r"seed: expected an int >= 0, received -1"),
        (
            {"lam": 0.1, "pretrain_epochs": -1},
            ValueError,
            r"pretrain_epochs: expected an int in \[0, 1000\], received -1",
        ),
    ],
)
def test_config_refuses_bad_parameters_naming_them(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        SgapConfig(**kwargs)


@pytest.mark.parametrize(
    ("min_faces", "max_faces", "match"),
    [
        (5, 20, r"max_faces: expected <= 19 .* received 20"),
        (5, None, r"max_faces: expected <= 19 .* received None"),
        (1, 9, r"min_faces: expected an int >= 2, received 1"),
        (10, 9, r"max_faces: expected an int >= 10, received 9"),
    ],
)
def test_training_population_excludes_the_evaluated_people(min_faces, max_faces, match):
    with pytest.raises(ValueError, match=match):
        check_background(min_faces=min_faces, max_faces=max_faces)


def test_shapes_and_an_untrained_generator_is_the_identity():
    torch.manual_seed(0)
    g, d = Generator().eval(), SiameseDiscriminator().eval()
    x = torch.rand(5, 1, 62, 47)
    y = g(x)
    assert y.shape == (5, 1, 62, 47)
    assert torch.equal(y, x)  # the last layer starts at zero: training starts at SSIM 1
    p = d(x, x.flip(0))
    assert p.shape == (5,) and bool(((p > 0) & (p < 1)).all())
    assert d.embed(x).shape == (5, 64)


def test_torch_ssim_is_the_audits_ssim(rng):
    a = rng.random((4, 62, 47))
    b = np.clip(a + 0.1 * rng.standard_normal(a.shape), 0, 1)
    got = ssim(torch.from_numpy(a)[:, None], torch.from_numpy(b)[:, None]).numpy()
    np.testing.assert_allclose(got, ssim_per_face(a, b), atol=1e-10)


def test_pairs_are_half_same_half_different(rng):
    labels = np.repeat(np.arange(6), 5)
    pairs = sample_pairs(np.arange(30), labels, rng)
    assert pairs.different.sum() == 15
    same = pairs.different == 0
    assert (labels[pairs.a][same] == labels[pairs.b][same]).all()
    assert (pairs.a[same] != pairs.b[same]).all()
    assert (labels[pairs.a][~same] != labels[pairs.b][~same]).all()


@pytest.mark.slow
def test_training_writes_model_metadata_and_curves(trained, small):
    result, _, out = trained
    for name in ("sgap.onnx", "discriminator.onnx", "sgap.json", "training.png", "samples.png", "checkpoint.pt"):
        assert (out / name).stat().st_size > 0, name
    meta = json.loads((out / "sgap.json").read_text())
    assert meta["lambda"] == LAMBDA and meta["ssim_floor"] == pytest.approx(1 - LAMBDA)
    assert meta["population"]["max_faces"] == 9 and meta["population"]["n_images"] == len(small[0])
    assert len(meta["history"]) == 2 and {"d_loss", "val_d_accuracy_real", "val_fooling_rate"} <= set(
        meta["history"][0]
    )
    assert 0.0 <= meta["achieved"]["held_out"]["val_d_accuracy_privatized"] <= 1.0
    # The discriminator learnt verification on real pairs before the game, and its export matches torch.
    assert [r["pretrain_epoch"] for r in meta["pretrain_history"]] == [1.0, 2.0]
    assert meta["discriminator_onnx"]["max_abs_difference_vs_torch"] <= 1e-4
    # The held-out people are whole identities the generator and discriminator never trained on.
    assert not set(small[1][result.train_mask]) & set(small[1][result.val_mask])


def test_onnx_output_equals_torch_on_real_faces(trained, small):
    result, report, out = trained
    assert report["onnx"]["max_abs_difference_vs_torch"] <= 1e-4
    images = small[0]
    with torch.no_grad():
        ref = result.generator.eval()(torch.from_numpy(images[:, None])).numpy()[:, 0]
    got = SgapPrivatizer.load(out / "sgap.onnx", enforce_ssim=False).generate(images)
    assert got.shape == images.shape and got.dtype == np.float32
    assert float(np.abs(got - ref).max()) <= 1e-4


def test_ssim_constraint_is_honoured_on_training_data(trained, small):
    _, report, out = trained
    floor = 1 - LAMBDA
    assert report["achieved"]["ssim_train"]["min"] >= floor
    images = small[0]
    priv = SgapPrivatizer.load(out / "sgap.onnx")
    assert priv.lam == LAMBDA
    s = ssim_per_face(images, priv.privatize(images))
    assert s.min() >= floor


def test_the_guard_pulls_a_face_back_to_the_floor(trained, small, monkeypatch):
    _, _, out = trained
    images = small[0][:3]
    priv = SgapPrivatizer.load(out / "sgap.onnx")
    monkeypatch.setattr(priv, "generate", lambda x: 1.0 - np.asarray(x, dtype=np.float32))  # a negative: SSIM < 0
    got = priv.privatize(images)
    assert priv.n_projected_ == 3
    assert ssim_per_face(images, got).min() >= priv.ssim_floor


@pytest.mark.slow
def test_resume_continues_to_the_same_generator(small, tmp_path):
    images, labels = small
    straight = train_sgap(images, labels, SgapConfig(lam=LAMBDA, epochs=2, batch_size=16, seed=5))
    train_sgap(images, labels, SgapConfig(lam=LAMBDA, epochs=1, batch_size=16, seed=5), checkpoint_dir=tmp_path)
    resumed = train_sgap(
        images, labels, SgapConfig(lam=LAMBDA, epochs=2, batch_size=16, seed=5), checkpoint_dir=tmp_path, resume=True
    )
    assert resumed.epochs_resumed == 1 and len(resumed.history) == 2
    for (name, a), b in zip(
        straight.generator.state_dict().items(), resumed.generator.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match=r"was written by another run \(configuration differs in \['lambda'\]\)"):
        train_sgap(
            images, labels, SgapConfig(lam=0.3, epochs=2, batch_size=16, seed=5), checkpoint_dir=tmp_path, resume=True
        )


def test_own_discriminator_protocol_on_unchanged_faces_is_its_real_pair_accuracy(trained, small, monkeypatch):
    """The paper's figure through the anonymiser interface: with the 'privatized' faces equal to the
    originals, accuracy on privatized pairs equals accuracy on real pairs and the fooling rate equals
    the discriminator's own false 'different' rate; with the generator's faces it is computed on them."""
    from peep.lab.anonymize.methods import make_anonymiser

    images, labels = small
    sgap = make_anonymiser("sgap", {"model": str(trained[2] / "sgap.onnx")}).fit(images)
    anchors = np.arange(0, images.shape[0], 2)
    same = sgap.own_protocol(images, images, labels, anchors, 0)
    assert same is not None and same["n_pairs"] == anchors.size
    assert same["accuracy_privatized"] == same["accuracy_real"]
    assert same["fooling_rate"] == same["false_different_real"]
    released = sgap.transform(images).images
    got = sgap.own_protocol(images, released, labels, anchors, 0)
    assert got is not None and 0.0 <= got["fooling_rate"] <= 1.0
    # The privatized face is the anchor, the partner stays original: a judge that calls faces "different" when
    # their mean brightness differs says so for every same-person pair whose anchor was inverted.
    from peep.lab.sgap.runtime import SgapDiscriminator

    monkeypatch.setattr(
        SgapDiscriminator, "p_different", lambda self, a, b: (np.abs(a.mean((1, 2)) - b.mean((1, 2))) > 0.2) * 1.0
    )
    bright = np.clip(images + 0.5, 0.0, 1.0)
    judged = sgap.own_protocol(images, bright, labels, anchors, 0)
    assert judged is not None and judged["fooling_rate"] == 1.0 and judged["false_different_real"] == 0.0


def test_bad_model_file_is_named(tmp_path):
    bad = tmp_path / "x.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(SgapModelError, match=r"--model .*x.onnx: not an ONNX model"):
        SgapPrivatizer.load(bad)
    with pytest.raises(SgapModelError, match="cannot read it"):
        SgapPrivatizer.load(tmp_path / "missing.onnx")


def test_faces_of_the_wrong_shape_are_refused(trained):
    priv = SgapPrivatizer.load(trained[2] / "sgap.onnx")
    with pytest.raises(ValueError, match=r"faces: expected shape \(n, 62, 47\), received \(2, 47, 62\)"):
        priv.privatize(np.zeros((2, 47, 62)))


@pytest.mark.slow
def test_cli_trains_and_refuses_bad_options(tmp_path, data_home, capsys):
    from peep.server.cli import main

    rc = main(["sgap", "train", "--lambda", "1.5", "--out", str(tmp_path / "bad")])
    assert rc == 2 and "--lambda: expected a number in (0.0, 1.0), received 1.5" in capsys.readouterr().err
    rc = main(["sgap", "train", "--lambda", "0.1", "--max-faces", "25", "--out", str(tmp_path / "bad")])
    assert rc == 2 and "--max-faces: expected <= 19" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()

    out = tmp_path / "sweep"
    args = ["sgap", "train", "--lambda", "0.1,0.3", "--epochs", "1", "--batch-size", "8", "--max-faces", "9"]
    args += ["--max-subjects", "6", "--max-per-subject", "5", "--data-home", data_home, "--out", str(out)]
    rc = main([*args, "--threads", "1", "--json", "--no-progress"])
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    rows = json.loads(captured.out)
    assert [r["lambda"] for r in rows] == [0.1, 0.3]
    assert all(r["onnx_max_abs_difference"] <= 1e-4 for r in rows)
    assert (out / "lambda-0.1" / "sgap.onnx").is_file() and (out / "lambda-0.3" / "sgap.json").is_file()
    assert (out / "sweep.png").is_file()
    assert json.loads((out / "sweep.json").read_text())["population"]["max_faces"] == 9


@pytest.mark.slow
def test_anonymize_train_sgap_is_the_same_command(tmp_path, data_home, capsys):
    """The design names it peep anonymize train-sgap (docs/DESIGN.md): same options, same checks, same output."""
    from peep.server.cli import main

    rc = main(["anonymize", "train-sgap", "--lambda", "0.1", "--max-faces", "25", "--out", str(tmp_path / "bad")])
    assert rc == 2 and "--max-faces: expected <= 19" in capsys.readouterr().err
    out = tmp_path / "one"
    args = ["anonymize", "train-sgap", "--lambda", "0.2", "--epochs", "1", "--batch-size", "8", "--max-faces", "9"]
    args += ["--max-subjects", "6", "--max-per-subject", "5", "--data-home", data_home, "--out", str(out)]
    assert main([*args, "--threads", "1", "--json", "--no-progress"]) == 0, capsys.readouterr().err
    assert (out / "sgap.onnx").is_file()
    assert json.loads((out / "sgap.json").read_text())["lambda"] == 0.2


# As an install without the `sgap` extra sees it: importing torch fails as if it were absent.
WITHOUT_TORCH = "import sys; sys.modules['torch'] = None\n"


def _run_without_torch(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH + code], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_runtime_needs_no_torch(trained, tmp_path):
    model = trained[2] / "sgap.onnx"
    code = (
        "import numpy as np\n"
        "from peep.lab.sgap.runtime import SgapPrivatizer\n"
        f"p = SgapPrivatizer.load({str(model)!r})\n"
        "x = np.random.default_rng(0).random((3, 62, 47)).astype(np.float32)\n"
        "y = p.privatize(x)\n"
        "assert 'torch' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
        "print(y.shape, p.lam)\n"
    )
    r = _run_without_torch(code, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"(3, 62, 47) {LAMBDA}"


def test_training_without_torch_names_the_extra(tmp_path):
    code = "from peep.server.cli import main; sys.exit(main(sys.argv[1:]))"
    r = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH + code, "sgap", "train", "--lambda", "0.1", "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert "pip install './lab[sgap]'" in r.stderr and not (tmp_path / "o").exists()


# Closer to an install without torch than WITHOUT_TORCH: `import torch` fails and sys.modules holds no 'torch'
# (libraries that probe sys.modules.get('torch'), as scikit-learn's array-API helpers do, see nothing).
NO_TORCH_INSTALLED = (
    "import sys\n"
    "class NoTorch:\n"
    "    def find_spec(self, name, path=None, target=None):\n"
    "        if name.split('.')[0] == 'torch':\n"
    "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
    "sys.meta_path.insert(0, NoTorch())\n"
)


@pytest.mark.slow
def test_anonymize_run_and_evaluate_method_sgap_without_torch(trained, sweep, data_home, tmp_path):
    """The anonymiser interface's sgap method: `peep anonymize run --method sgap --model FILE.onnx` and
    `evaluate --methods sgap,blur --model SWEEP_DIR` (both protocols, one row per λ, the paper's own
    discriminator, the λ sweep plot) where importing torch fails."""
    folder = tmp_path / "faces"
    for person in ("Laura_Bush", "Colin_Powell", "Jennifer_Capriati", "Tony_Blair"):  # two labelled female, two male
        (folder / person).mkdir(parents=True)
        for f in sorted((Path(data_home) / "lfw_home" / "lfw_funneled" / person).glob("*.jpg"))[:10]:
            (folder / person / f.name).write_bytes(f.read_bytes())
    model = trained[2] / "sgap.onnx"
    common = f"'--dataset', {str(folder)!r}, '--min-faces', '10', '--model', {str(model)!r}"
    code = (
        "import os; os.environ['PEEP_PROGRESS'] = '0'\n"
        "from peep.server.cli import main\n"
        f"assert main(['anonymize', 'run', '--method', 'sgap', {common}, '--out', 'run']) == 0\n"
        f"assert main(['anonymize', 'evaluate', '--methods', 'sgap,blur', '--dataset', {str(folder)!r},"
        f" '--min-faces', '10', '--model', {str(sweep)!r}, '--components', '8', '--draws', '1',"
        " '--jobs', '1', '--out', 'eval']) == 0\n"
        "assert not [m for m in sys.modules if m.split('.')[0] == 'torch']\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", NO_TORCH_INSTALLED + code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
        env={**os.environ, "PEEP_CACHE_DIR": str(tmp_path / "cache")},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["method"] == "sgap" and manifest["model"]["lambda"] == LAMBDA and manifest["n_records"] == 40
    assert "Laura" not in (tmp_path / "run" / "manifest.json").read_text()
    doc = json.loads((tmp_path / "eval" / "anonymize.json").read_text())
    assert list(doc["methods"]) == [f"sgap λ={LAMBDA:g}", "sgap λ=0.3", "blur"]
    for lam in (LAMBDA, 0.3):
        r_sgap = doc["methods"][f"sgap λ={lam:g}"]
        assert r_sgap["model"]["lambda"] == lam and r_sgap["ssim_mean"] >= 1 - lam - 1e-3
        assert {"identity_mixture", "naive_accuracy", "parrot_accuracy", "percent_parrot", "reduced_sets"} <= set(
            r_sgap
        )
        own = r_sgap["own_protocol"]  # the discriminator beside each generator, on the 4 people's test faces
        assert own["n_pairs"] >= 4 and 0.0 <= own["fooling_rate"] <= 1.0
    assert "own_protocol" not in doc["methods"]["blur"]
    points = doc["sgap_sweep"]["points"]
    assert [p["lambda"] for p in points] == [LAMBDA, 0.3]
    assert points[1]["parrot_accuracy_max"] == doc["methods"]["sgap λ=0.3"]["parrot_accuracy"]["max"]
    assert doc["plots"]["sgap_sweep"] == "sgap_sweep.png" and (tmp_path / "eval" / "sgap_sweep.png").is_file()
    assert "paper's own discriminator" in " ".join(doc["findings"])
    assert "SGAP over its distortion constraint" in (tmp_path / "eval" / "report.html").read_text()


def test_model_options_name_what_is_wrong(trained, sweep, tmp_path, capsys):
    from peep.server.cli import main

    base = ["anonymize", "run", "--method", "sgap", "--dataset", "lfw", "--out", str(tmp_path / "o")]
    assert main([*base, "--model", str(sweep)]) == 2
    assert "run writes one dataset, so expected one generator; received 2" in capsys.readouterr().err
    assert main([*base, "--model", str(tmp_path)]) == 2
    assert "the folder has neither" in capsys.readouterr().err
    two = ["--model", str(trained[2] / "sgap.onnx"), "--model", str(sweep / f"lambda-{LAMBDA:g}")]
    ev = ["anonymize", "evaluate", "--methods", "sgap", "--dataset", "lfw", "--out", str(tmp_path / "e")]
    assert main([*ev, *two]) == 2
    assert "expected generators of distinct λ" in capsys.readouterr().err
    assert not (tmp_path / "o").exists() and not (tmp_path / "e").exists()
