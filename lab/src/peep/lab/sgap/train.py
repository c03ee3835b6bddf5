"""Training an SGAP generator on the public background population, and exporting it to ONNX.

Importing this module imports torch (the ``sgap`` extra of peep-server); the
command imports it only when it trains. What it writes (``write_model``):

``sgap.onnx``
    The generator in eval mode, input ``faces`` (n, 1, 62, 47) → output
    ``privatized`` (n, 1, 62, 47), with the metadata property ``peep.sgap``.
``sgap.json``
    λ, the training population, the configuration, the achieved SSIM, the
    held-out discriminator accuracy, the export check, timings and the
    per-epoch history.
``discriminator.onnx``
    The Siamese discriminator (eval mode), inputs ``left`` and ``right`` →
    ``p_different``, for the paper's protocol in ``peep anonymize evaluate``.
``training.png``, ``samples.png``
    The training curves and original/privatized pairs of held-out faces.
``checkpoint.pt``
    Networks, optimisers, random states and history after the last finished
    epoch; ``resume=True`` continues from it.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from peep.lab.sgap.config import SgapConfig
from peep.lab.sgap.model import FACE_SHAPE, Generator, SiameseDiscriminator, discriminator_loss, ssim
from peep.lab.sgap.pairs import Pairs, sample_pairs, split_identities
from peep.lab.sgap.runtime import (
    DISCRIMINATOR_FILE,
    DISCRIMINATOR_INPUTS,
    DISCRIMINATOR_METADATA_KEY,
    DISCRIMINATOR_OUTPUT,
    INPUT_NAME,
    METADATA_KEY,
    OUTPUT_NAME,
    SgapPrivatizer,
    ssim_per_face,
)

CHECKPOINT = "checkpoint.pt"
OPSET = 17


@dataclass
class SgapTrainingResult:
    """A trained generator and what training measured."""

    config: SgapConfig
    generator: Generator
    discriminator: SiameseDiscriminator
    history: list[dict[str, float]]
    train_mask: NDArray[np.bool_]
    val_mask: NDArray[np.bool_]
    val_pairs: Pairs
    seconds: float
    epochs_resumed: int = 0
    pretrain_history: list[dict[str, float]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


def _tensor(images: NDArray[np.float32], idx: NDArray[np.int64]) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(images[idx][:, None]))


def _mirror(x: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
    """Each face mirrored left-right with probability 1/2: a mirrored face is the same person."""
    flip = torch.from_numpy(rng.random(x.shape[0]) < 0.5)
    return torch.where(flip[:, None, None, None], torch.flip(x, dims=[3]), x)


@torch.no_grad()
def _privatize_torch(g: Generator, images: NDArray[np.float32], batch: int = 256) -> NDArray[np.float32]:
    g.eval()
    out = [g(torch.from_numpy(images[i : i + batch][:, None])).numpy()[:, 0] for i in range(0, len(images), batch)]
    return np.concatenate(out).astype(np.float32) if out else images[:0].copy()


@torch.no_grad()
def discriminator_accuracy(
    d: SiameseDiscriminator, left: NDArray[np.float32], right: NDArray[np.float32], different: NDArray[np.float32]
) -> dict[str, float]:
    """The discriminator (eval mode) on pairs ``(left[i], right[i])``: accuracy overall, on same and different pairs."""
    d.eval()
    p = d(torch.from_numpy(left[:, None]), torch.from_numpy(right[:, None])).numpy()
    said_diff = p >= 0.5
    truth = different >= 0.5
    ok = said_diff == truth
    return {
        "accuracy": float(ok.mean()),
        "accuracy_same": float(ok[~truth].mean()) if (~truth).any() else float("nan"),
        "accuracy_different": float(ok[truth].mean()) if truth.any() else float("nan"),
    }


def evaluate(
    g: Generator, d: SiameseDiscriminator, images: NDArray[np.float32], pairs: Pairs, floor: float
) -> dict[str, float]:
    """Held-out numbers: the discriminator on real and privatized pairs, SSIM of the privatized anchors."""
    a, b = images[pairs.a], images[pairs.b]
    pa = _privatize_torch(g, a)
    real = discriminator_accuracy(d, a, b, pairs.different)
    priv = discriminator_accuracy(d, pa, b, pairs.different)
    s = ssim_per_face(a, pa)
    return {
        "val_d_accuracy_real": real["accuracy"],
        "val_d_accuracy_privatized": priv["accuracy"],
        # The paper's privacy figure: same-person pairs its discriminator calls different.
        "val_fooling_rate": 1.0 - priv["accuracy_same"],
        "val_ssim_mean": float(s.mean()),
        "val_ssim_min": float(s.min()),
        "val_ssim_ok": float((s >= floor).mean()),
    }


def train_sgap(
    images: NDArray[np.float32],
    labels: NDArray[np.int64],
    config: SgapConfig,
    *,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    progress: Callable[[int, int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> SgapTrainingResult:
    """Train an SGAP generator and its Siamese discriminator.

    First the discriminator alone learns face verification on real pairs
    for ``config.pretrain_epochs`` epochs (faces mirrored at random). Then
    each epoch pairs every training face (the anchor) with another face, half
    of the same person and half of someone else. The discriminator learns to
    tell from ``(privatized anchor, partner)`` whether they are different
    people (cross-entropy); the generator learns to make it call the
    same-person pairs "different", under the hinge penalty that keeps
    SSIM(anchor, privatized) >= 1 − λ + slack.

    Parameters
    ----------
    images : ndarray of shape (n_images, 62, 47), float32 in [0, 1]
        The public background population only.
    labels : ndarray of shape (n_images,)
    config : SgapConfig
    checkpoint_dir : Path, optional
        Where ``checkpoint.pt`` is written after each epoch.
    resume : bool
        Continue from ``checkpoint_dir/checkpoint.pt`` (same configuration and data).
    progress : callable (done, total), optional
        Called after each step (total = epochs × steps per epoch).
    log : callable, optional
        Receives one line per epoch.
    """
    images = np.asarray(images, dtype=np.float32)
    labels = np.asarray(labels, dtype=np.int64)
    if images.ndim != 3 or images.shape[1:] != FACE_SHAPE:
        raise ValueError(f"images: expected shape (n, {FACE_SHAPE[0]}, {FACE_SHAPE[1]}), received {images.shape}")
    if labels.shape != (images.shape[0],):
        raise ValueError(f"labels: expected shape ({images.shape[0]},), received {labels.shape}")
    if images.size and (images.min() < 0.0 or images.max() > 1.0):
        raise ValueError("images: expected values in [0, 1]")
    counts = np.bincount(np.unique(labels, return_inverse=True)[1])
    if counts.size and counts.min() < 2:
        raise ValueError("labels: every person needs at least 2 images (same-person pairs)")

    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    train_mask, val_mask = split_identities(labels, config.val_fraction, rng)
    train_idx = np.flatnonzero(train_mask).astype(np.int64)
    val_pairs = sample_pairs(np.flatnonzero(val_mask).astype(np.int64), labels, np.random.default_rng(config.seed + 1))

    g = Generator(width=config.width)
    d = SiameseDiscriminator()
    betas = (config.beta1, config.beta2)
    opt_g = torch.optim.Adam(g.parameters(), lr=config.lr_generator, betas=betas)
    opt_d = torch.optim.Adam(d.parameters(), lr=config.lr_discriminator, betas=betas)
    history: list[dict[str, float]] = []
    pretrain_history: list[dict[str, float]] = []
    start_epoch = 0
    ckpt = checkpoint_dir / CHECKPOINT if checkpoint_dir is not None else None
    fingerprint = _data_fingerprint(images, labels)
    if resume:
        if ckpt is None or not ckpt.is_file():
            raise ValueError(f"resume: no checkpoint at {ckpt}")
        state = torch.load(ckpt, weights_only=False)
        # Only the number of epochs may change: resuming is how a run is extended.
        diff = sorted(k for k, v in config.to_dict().items() if k != "epochs" and state["config"].get(k) != v)
        if diff or state["data"] != fingerprint:
            what = f"configuration differs in {diff}" if diff else "training faces differ"
            raise ValueError(f"resume: {ckpt} was written by another run ({what})")
        g.load_state_dict(state["generator"])
        d.load_state_dict(state["discriminator"])
        opt_g.load_state_dict(state["opt_generator"])
        opt_d.load_state_dict(state["opt_discriminator"])
        history = state["history"]
        pretrain_history = state.get("pretrain_history", [])
        start_epoch = int(state["epoch"])
        rng.bit_generator.state = state["numpy_rng"]
        torch.set_rng_state(state["torch_rng"])

    bs = config.batch_size
    steps = max(1, train_idx.size // bs)
    pre = config.pretrain_epochs
    total = (pre + config.epochs) * steps
    floor = config.ssim_floor
    target = floor + config.slack
    started = time.perf_counter()
    # A resumed run finished its pretraining before its first checkpoint.
    done = (pre + start_epoch) * steps if resume else 0
    if progress is not None:
        progress(done, total)
    if not resume:
        for epoch in range(pre):
            t0 = time.perf_counter()
            d.train()
            order = rng.permutation(train_idx)[: steps * bs]
            pairs = sample_pairs(order, labels, rng, pool=train_idx)
            loss_sum = 0.0
            for s in range(steps):
                sl = slice(s * bs, (s + 1) * bs)
                xa = _mirror(_tensor(images, pairs.a[sl]), rng)
                xb = _mirror(_tensor(images, pairs.b[sl]), rng)
                opt_d.zero_grad()
                loss_d = discriminator_loss(d.logit_different(xa, xb), torch.from_numpy(pairs.different[sl]))
                loss_d.backward()  # type: ignore[no-untyped-call]
                opt_d.step()
                loss_sum += loss_d.item()
                done += 1
                if progress is not None:
                    progress(done, total)
            a, b = images[val_pairs.a], images[val_pairs.b]
            acc = discriminator_accuracy(d, a, b, val_pairs.different)["accuracy"]
            row = {"pretrain_epoch": float(epoch + 1), "d_loss": loss_sum / steps, "val_d_accuracy_real": acc,
                   "seconds": time.perf_counter() - t0}  # fmt: skip
            pretrain_history.append(row)
            if log is not None:
                log(
                    f"discriminator pretraining {epoch + 1}/{pre}: d_loss {row['d_loss']:.3f}, held-out accuracy "
                    f"on real pairs {acc:.3f}, {row['seconds']:.1f}s"
                )
    for epoch in range(start_epoch, config.epochs):
        t0 = time.perf_counter()
        g.train()
        d.train()
        order = rng.permutation(train_idx)[: steps * bs]
        pairs = sample_pairs(order, labels, rng, pool=train_idx)
        sums = {"d_loss": 0.0, "g_adv_loss": 0.0, "g_penalty": 0.0, "train_ssim": 0.0, "train_fooling": 0.0}
        for s in range(steps):
            sl = slice(s * bs, (s + 1) * bs)
            xa = _tensor(images, pairs.a[sl])
            xb = _tensor(images, pairs.b[sl])
            y = torch.from_numpy(pairs.different[sl])
            # Discriminator: who is who behind the privatizer (the generator is held fixed here).
            for _ in range(config.discriminator_steps):
                with torch.no_grad():
                    fake = g(xa)
                opt_d.zero_grad()
                loss_d = discriminator_loss(d.logit_different(fake, xb), y)
                loss_d.backward()  # type: ignore[no-untyped-call]
                opt_d.step()
            # Generator: same-person pairs called "different", SSIM held at the floor.
            opt_g.zero_grad()
            fake = g(xa)
            same = y < 0.5
            logit = d.logit_different(fake, xb)
            adv = discriminator_loss(logit[same], torch.ones_like(logit[same]))
            s_img = ssim(fake, xa)
            pen = config.penalty * torch.relu(target - s_img).mean()
            (adv + pen).backward()  # type: ignore[no-untyped-call]
            opt_g.step()
            sums["d_loss"] += loss_d.item()
            sums["g_adv_loss"] += adv.item()
            sums["g_penalty"] += pen.item()
            sums["train_ssim"] += s_img.mean().item()
            sums["train_fooling"] += (logit[same] > 0).float().mean().item()
            done += 1
            if progress is not None:
                progress(done, total)
        row = {"epoch": float(epoch + 1), **{k: v / steps for k, v in sums.items()}}
        row.update(evaluate(g, d, images, val_pairs, floor))
        row["seconds"] = time.perf_counter() - t0
        history.append(row)
        if log is not None:
            log(
                f"epoch {epoch + 1}/{config.epochs}: d_loss {row['d_loss']:.3f}, g_adv {row['g_adv_loss']:.3f}, "
                f"train SSIM {row['train_ssim']:.3f} (floor {floor:.3f}), held-out D accuracy "
                f"{row['val_d_accuracy_real']:.3f} real / {row['val_d_accuracy_privatized']:.3f} privatized, "
                f"fooling {row['val_fooling_rate']:.3f}, {row['seconds']:.1f}s"
            )
        if ckpt is not None:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            tmp = ckpt.with_suffix(".tmp")
            torch.save(
                {
                    "config": config.to_dict(),
                    "data": fingerprint,
                    "epoch": epoch + 1,
                    "generator": g.state_dict(),
                    "discriminator": d.state_dict(),
                    "opt_generator": opt_g.state_dict(),
                    "opt_discriminator": opt_d.state_dict(),
                    "history": history,
                    "pretrain_history": pretrain_history,
                    "numpy_rng": rng.bit_generator.state,
                    "torch_rng": torch.get_rng_state(),
                },
                tmp,
            )
            tmp.replace(ckpt)  # a crash mid-save leaves the previous epoch's checkpoint
    g.eval()
    d.eval()
    return SgapTrainingResult(
        config=config,
        generator=g,
        discriminator=d,
        history=history,
        train_mask=train_mask,
        val_mask=val_mask,
        val_pairs=val_pairs,
        seconds=time.perf_counter() - started,
        epochs_resumed=start_epoch,
        pretrain_history=pretrain_history,
    )


def _data_fingerprint(images: NDArray[np.float32], labels: NDArray[np.int64]) -> str:
    import hashlib

    h = hashlib.sha256(np.ascontiguousarray(images).tobytes())
    h.update(np.ascontiguousarray(labels).tobytes())
    return h.hexdigest()


def export_onnx(generator: Generator, path: Path, metadata: dict[str, Any]) -> None:
    """Write the generator (eval mode) as ONNX with a dynamic batch axis and ``peep.sgap`` metadata."""
    _export(generator, 1, path, [INPUT_NAME], OUTPUT_NAME, METADATA_KEY, metadata)


def _export(
    module: torch.nn.Module,
    n_inputs: int,
    path: Path,
    input_names: list[str],
    output_name: str,
    key: str,
    metadata: dict[str, Any],
) -> None:
    """``module`` (eval mode) as ONNX at ``path``: face inputs, a dynamic batch axis, ``key`` metadata.

    The TorchScript exporter (``dynamo=False``): it needs nothing beyond torch
    and onnx, where torch's newer exporter also needs onnxscript. PyTorch
    deprecates it, but the pinned torch==2.13.0 has it, and every export is
    checked against torch's output. Written to a temporary file and renamed.
    """
    import onnx

    module.eval()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    dummy = tuple(torch.zeros((1, 1, *FACE_SHAPE)) for _ in range(n_inputs))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", UserWarning)
        torch.onnx.export(
            module,
            dummy,
            str(tmp),
            dynamo=False,
            opset_version=OPSET,
            input_names=input_names,
            output_names=[output_name],
            dynamic_axes={**{n: {0: "n"} for n in input_names}, output_name: {0: "n"}},
        )
    model = onnx.load(str(tmp))
    entry = model.metadata_props.add()
    entry.key = key
    entry.value = json.dumps(metadata, sort_keys=True)
    model.producer_name = "peep sgap train"
    onnx.checker.check_model(model)
    onnx.save(model, str(tmp))
    tmp.replace(path)


def export_discriminator(d: SiameseDiscriminator, path: Path, metadata: dict[str, Any]) -> float:
    """Write the Siamese discriminator (eval mode) as ONNX: ``left``, ``right`` (n, 1, 62, 47) → ``p_different`` (n,).

    ``peep anonymize evaluate`` runs it for the paper's own protocol (how often
    it calls a privatized face and another photo of the same person
    "different") on the evaluated people, whom it never saw. Returns the
    largest absolute difference between torch's and onnxruntime's
    probabilities on random faces (checked like the generator's export).
    """
    import onnxruntime as ort

    _export(d, 2, path, list(DISCRIMINATOR_INPUTS), DISCRIMINATOR_OUTPUT, DISCRIMINATOR_METADATA_KEY, metadata)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.rand((8, 1, *FACE_SHAPE), generator=gen), torch.rand((8, 1, *FACE_SHAPE), generator=gen)
    with torch.no_grad():
        ref = d(a, b).numpy()
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = sess.run([DISCRIMINATOR_OUTPUT], {DISCRIMINATOR_INPUTS[0]: a.numpy(), DISCRIMINATOR_INPUTS[1]: b.numpy()})
    return float(np.abs(ref - np.asarray(got)).max())


def export_difference(generator: Generator, path: Path, faces: NDArray[np.float32]) -> float:
    """Largest absolute difference between torch's and onnxruntime's output on ``faces``."""
    ref = _privatize_torch(generator, faces)
    got = SgapPrivatizer.load(path, enforce_ssim=False).generate(faces)
    return float(np.abs(ref - got).max()) if len(faces) else 0.0


def onnx_ms_per_face(path: Path, faces: NDArray[np.float32], repeats: int = 3) -> dict[str, float]:
    """onnxruntime on one thread: milliseconds per face, batch of 1 and batched (best of ``repeats``)."""
    priv = SgapPrivatizer.load(path, enforce_ssim=False, threads=1)
    n = min(len(faces), 64)
    one: list[float] = []
    batched: list[float] = []
    for _ in range(repeats):
        t = time.perf_counter()
        for f in faces[:n]:
            priv.generate(f[None])
        one.append((time.perf_counter() - t) / n * 1e3)
        t = time.perf_counter()
        priv.generate(faces[:n])
        batched.append((time.perf_counter() - t) / n * 1e3)
    t = time.perf_counter()
    full = SgapPrivatizer.load(path, enforce_ssim=True, threads=1)
    full.privatize(faces[:n])
    with_guard = (time.perf_counter() - t) / n * 1e3
    return {
        "ms_per_face_single": min(one),
        "ms_per_face_batched": min(batched),
        "ms_per_face_with_ssim_guard": with_guard,
    }


def summarise(result: SgapTrainingResult, images: NDArray[np.float32], labels: NDArray[np.int64]) -> dict[str, Any]:
    """Achieved SSIM (train and held out, generator only) and the final held-out discriminator numbers."""
    floor = result.config.ssim_floor
    out: dict[str, Any] = {}
    for name, mask in (("train", result.train_mask), ("held_out", result.val_mask)):
        x = images[mask]
        s = ssim_per_face(x, _privatize_torch(result.generator, x))
        out[f"ssim_{name}"] = {
            "mean": float(s.mean()),
            "min": float(s.min()),
            "fraction_at_or_above_floor": float((s >= floor).mean()),
            "n_faces": int(s.size),
        }
    out["held_out"] = evaluate(result.generator, result.discriminator, images, result.val_pairs, floor)
    out["held_out"]["n_pairs"] = int(result.val_pairs.a.size)
    out["held_out"]["n_people"] = int(np.unique(labels[result.val_mask]).size)
    return out


def write_model(
    result: SgapTrainingResult,
    images: NDArray[np.float32],
    labels: NDArray[np.int64],
    out_dir: Path,
    population: dict[str, Any],
) -> dict[str, Any]:
    """Export, check and describe a trained generator in ``out_dir`` (see the module docstring)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = result.config
    numbers = summarise(result, images, labels)
    population = {
        **population,
        "n_images": int(images.shape[0]),
        "n_people": int(np.unique(labels).size),
        "n_people_trained": int(np.unique(labels[result.train_mask]).size),
        "n_people_held_out": int(np.unique(labels[result.val_mask]).size),
    }
    embedded = {
        "method": "sgap",
        "lambda": float(cfg.lam),
        "ssim_floor": cfg.ssim_floor,
        "face_shape": list(FACE_SHAPE),
        "input": f"{INPUT_NAME}: float32 (n, 1, 62, 47) in [0, 1]",
        "population": population,
        "config": cfg.to_dict(),
        "torch": torch.__version__,
    }
    onnx_path = out_dir / "sgap.onnx"
    export_onnx(result.generator, onnx_path, embedded)
    check_faces = images[result.val_mask][:64]
    diff = export_difference(result.generator, onnx_path, check_faces)
    timing = onnx_ms_per_face(onnx_path, images[result.val_mask])
    priv = SgapPrivatizer.load(onnx_path)
    priv.privatize(images[result.val_mask])
    d_path = out_dir / DISCRIMINATOR_FILE
    d_diff = export_discriminator(
        result.discriminator, d_path, {"lambda": float(cfg.lam), "population": population, "torch": torch.__version__}
    )
    report: dict[str, Any] = {
        **embedded,
        "onnx": {
            "file": onnx_path.name,
            "sha256": priv.sha256,
            "bytes": onnx_path.stat().st_size,
            "opset": OPSET,
            "max_abs_difference_vs_torch": diff,
            "n_faces_checked": len(check_faces),
            **timing,
        },
        "discriminator_onnx": {
            "file": d_path.name,
            "bytes": d_path.stat().st_size,
            "max_abs_difference_vs_torch": d_diff,
        },
        "achieved": numbers,
        "ssim_guard_pulled_back_held_out": int(priv.n_projected_),
        "training_seconds": result.seconds,
        "epochs_resumed_from": result.epochs_resumed,
        "history": result.history,
        "pretrain_history": result.pretrain_history,
    }
    (out_dir / "sgap.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    plot_history(result.history, cfg.ssim_floor, out_dir / "training.png", title=f"SGAP λ={cfg.lam:g}")
    plot_samples(images[result.val_mask][:8], priv.privatize(images[result.val_mask][:8]), out_dir / "samples.png")
    return report


def plot_history(history: list[dict[str, float]], floor: float, path: Path, *, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [h["epoch"] for h in history]
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    ax = axes[0]
    ax.plot(ep, [h["d_loss"] for h in history], label="discriminator loss")
    ax.plot(ep, [h["g_adv_loss"] for h in history], label="generator adversarial loss")
    ax.plot(ep, [h["g_penalty"] for h in history], label="SSIM penalty")
    ax.set_xlabel("epoch")
    ax.legend(fontsize=8, loc="upper right")
    ax = axes[1]
    ax.plot(ep, [h["train_ssim"] for h in history], label="train (batches)")
    ax.plot(ep, [h["val_ssim_mean"] for h in history], label="held out, mean")
    ax.plot(ep, [h["val_ssim_min"] for h in history], label="held out, min")
    ax.axhline(floor, color="k", ls="--", lw=1, label="floor 1 − λ")
    ax.set_xlabel("epoch")
    ax.set_ylabel("SSIM")
    ax.legend(fontsize=8, loc="upper right")
    ax = axes[2]
    ax.plot(ep, [h["val_d_accuracy_real"] for h in history], label="D accuracy, real pairs")
    ax.plot(ep, [h["val_d_accuracy_privatized"] for h in history], label="D accuracy, privatized pairs")
    ax.plot(ep, [h["val_fooling_rate"] for h in history], label="fooling rate (same called different)")
    ax.set_ylim(0, 1)
    ax.set_xlabel("epoch")
    ax.set_title("held-out background people", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_samples(original: NDArray[np.float32], privatized: NDArray[np.float32], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(original)
    fig, axes = plt.subplots(2, max(n, 1), figsize=(1.2 * max(n, 1), 3.2), squeeze=False)
    s = ssim_per_face(original, privatized) if n else np.zeros(0)
    for i in range(max(n, 1)):
        for r in range(2):
            axes[r, i].axis("off")
        if i < n:
            axes[0, i].imshow(original[i], cmap="gray", vmin=0, vmax=1)
            axes[1, i].imshow(privatized[i], cmap="gray", vmin=0, vmax=1)
            axes[1, i].set_title(f"SSIM {s[i]:.2f}", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
