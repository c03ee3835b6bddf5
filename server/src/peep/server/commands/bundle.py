"""``peep bundle build``, ``peep bundle verify`` and ``peep bundle calibrate``."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

from peep.core.bundle import load_private_key, load_public_key, verify_bundle
from peep.core.exceptions import BundleError
from peep.core.imaging import FaceGeometry
from peep.core.mechanisms import mechanism_kinds
from peep.core.projections import projection_class, projection_kinds
from peep.server.errors import UsageError


def parse_size(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)[xX](\d+)", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT such as 47x62, received {text!r}")
    w, h = int(m.group(1)), int(m.group(2))
    if not (8 <= w <= 1024 and 8 <= h <= 1024):
        raise argparse.ArgumentTypeError(f"expected sizes between 8 and 1024 pixels, received {text!r}")
    return w, h


def add_dataset_options(p: argparse.ArgumentParser, *, min_faces: int) -> None:
    p.add_argument("--dataset", required=True, help="'lfw' or a folder-per-identity image directory")
    p.add_argument(
        "--data-home", default=None, help="scikit-learn data home holding lfw_home/ (default: $SCIKIT_LEARN_DATA)"
    )
    p.add_argument(
        "--min-faces", type=int, default=min_faces, help=f"identities with at least N images (default {min_faces})"
    )


def register(sub: Any) -> None:
    p = sub.add_parser("bundle", help="build and verify signed projection bundles")
    bsub = p.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)
    b = bsub.add_parser("build", help="fit a projection on a dataset and write a signed bundle")
    add_dataset_options(b, min_faces=5)
    b.add_argument(
        "--max-faces", type=int, default=None, help="only identities with at most N images (background population)"
    )
    b.add_argument(
        "--projection",
        choices=projection_kinds(),
        default="fisherfaces",
        help="what the projector computes from a face (default fisherfaces, the audit's best at honest ε; "
        "eigenfaces is the paper's)",
    )
    b.add_argument("--components", type=int, required=True, help="dimension of a template (nc)")
    b.add_argument(
        "--mirror",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="fit on the faces' mirror images too (default: on for fisherfaces, off for eigenfaces; "
        "not for descriptor projections such as dlib-resnet)",
    )
    b.add_argument("--size", type=parse_size, default=(47, 62), metavar="WxH", help="face geometry (default 47x62)")
    b.add_argument("--equalize", action="store_true", help="histogram-equalise faces (devices will too)")
    b.add_argument(
        "--radius-quantile", type=float, default=0.95, help="quantile of face norms used as the L2/L1 clip radius"
    )
    b.add_argument("--signing-key", required=True, help="Ed25519 private key (from peep keys generate)")
    b.add_argument("--out", required=True, help="bundle directory to write")
    b.set_defaults(handler=build)
    v = bsub.add_parser("verify", help="check a bundle's hashes and signature")
    v.add_argument("bundle_dir")
    v.add_argument("--public-key", required=True)
    v.set_defaults(handler=verify)
    c = bsub.add_parser(
        "calibrate",
        help="project public faces with a bundle as a device does: the calibration set of device models",
        description="Write clean, unkeyed, bounded projections of public faces (no noise, no site key) that "
        "every signed device model carries, for devices to set their thresholds on "
        "(training.device_models.calibration). No person the server trains on may be among them: exclude the "
        "background population (--exclude) and anyone enrolled.",
    )
    c.add_argument("--bundle", required=True, help="the signed bundle directory the devices use")
    c.add_argument("--public-key", required=True, help="the deployer's public key the bundle verifies against")
    add_dataset_options(c, min_faces=1)
    c.add_argument("--max-faces", type=int, default=None, help="only identities with at most N images")
    c.add_argument("--max-per-person", type=int, default=None, help="at most N faces of one person")
    c.add_argument(
        "--people-from", default=None, metavar="FILE", help="only the people named in FILE (one folder name a line)"
    )
    c.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="FILE",
        help="never the people named in FILE (one a line; repeatable): the server's background population "
        "(enrolled as background:<name>) and anyone enrolled",
    )
    c.add_argument(
        "--mechanism",
        choices=mechanism_kinds(),
        default=None,
        help="the mechanism kind whose domain the server's model is trained on (default: the bundle's)",
    )
    c.add_argument("--out", required=True, metavar="FILE.npz", help="the calibration file to write")
    c.set_defaults(handler=calibrate)


def build(args: argparse.Namespace) -> int:
    from peep.server.bundles.build import build_bundle
    from peep.server.datasets import DatasetError, load_dataset
    from peep.server.progress import progress_printer

    if args.components < 1:
        raise UsageError(f"--components: expected >= 1, received {args.components}")
    try:
        key = load_private_key(args.signing_key)
    except BundleError as exc:
        raise UsageError(f"--signing-key: {exc}") from exc
    w, h = args.size
    geometry = FaceGeometry(width=w, height=h, equalize=args.equalize)
    input_kind = projection_class(args.projection).input_kind
    encoder: Any = None
    if input_kind != "pixels":
        from peep.server.descriptors import descriptor_encoder

        if args.mirror:
            raise UsageError(
                f"--mirror: expected --no-mirror or nothing with --projection {args.projection} "
                f"(its input is a {input_kind} descriptor, not pixels), received --mirror"
            )
        encoder = descriptor_encoder(input_kind)
    t0 = time.perf_counter()
    try:
        ds = load_dataset(
            args.dataset,
            data_home=args.data_home,
            min_faces=args.min_faces,
            max_faces=args.max_faces,
            geometry=geometry,
            progress=progress_printer(
                "detecting and normalising faces" + (f" and their {input_kind} descriptors" if encoder else "")
            ),
            encoder=encoder,
        )
    except DatasetError as exc:
        raise UsageError(str(exc)) from exc
    dimension = geometry.n_pixels if encoder is None else int(encoder.dimension)
    if args.components > min(ds.n_images - 1, dimension):
        raise UsageError(
            f"--components: expected at most {min(ds.n_images - 1, dimension)} for {ds.n_images} faces "
            f"({'pixels' if encoder is None else input_kind + ' descriptors'} of dimension {dimension}), "
            f"received {args.components}"
        )
    try:
        bundle = build_bundle(
            ds,
            n_components=args.components,
            signing_key=key,
            out_dir=args.out,
            radius_quantile=args.radius_quantile,
            projection=args.projection,
            mirror=args.mirror,
            network=None if encoder is None else encoder.identity,
        )
    except ValueError as exc:
        # The projection knows its own limit on K (e.g. fisherfaces: identities - 1).
        field, _, detail = str(exc).partition(": ")
        if field == "n_components":
            raise UsageError(f"--components ({args.projection} on {ds.n_subjects} identities): {detail}") from exc
        raise
    print(
        f"bundle {bundle.bundle_id} ({bundle.projection_kind}) -> {args.out}\n"
        f"  {ds.n_images} faces of {ds.n_subjects} identities ({ds.n_skipped} without a detected face skipped), "
        f"{w}x{h}, nc={bundle.n_components}{_projection_summary(bundle.metadata)}\n"
        f"  L2 radius {bundle.bounds.radius_l2:.3f}, L1 radius {bundle.bounds.radius_l1:.3f} "
        f"({args.radius_quantile:.0%} quantile of the bundle faces' norms); {time.perf_counter() - t0:.1f} s",
        file=sys.stdout,
    )
    return 0


def _projection_summary(metadata: dict[str, Any]) -> str:
    """What the projection kept, from the bundle metadata (empty when it records nothing we know)."""
    ratio = metadata.get("explained_variance_ratio")
    if ratio:
        return f", {sum(ratio):.1%} of variance kept"
    descriptor = metadata.get("dlib_resnet")
    if descriptor:
        network = metadata.get("input", {}).get("network", {})
        return (
            f"; whitened PCA of {metadata.get('input', {}).get('dimension', '?')}-d dlib ResNet descriptors "
            f"({sum(descriptor['explained_variance_ratio']):.1%} of their variance kept), network "
            f"{str(network.get('network_sha256', '?'))[:12]}… ({network.get('package', '?')})"
        )
    fisher = metadata.get("fisherfaces")
    if fisher:
        from peep.core.mechanisms import mechanism_classes

        lam = fisher.get("discriminant_eigenvalues") or [float("nan")]
        unit = [k for k, cls in mechanism_classes().items() if cls.domain == "unit"]
        return (
            f"; LDA on {fisher['n_classes']} identities over {fisher['n_pca']} whitened eigenfaces "
            f"({fisher['pca_variance_ratio']:.1%} of variance), Fisher ratios {lam[0]:.2f} .. {lam[-1]:.2f}"
            + (f"; its 'unit' output is what {', '.join(unit)} release" if unit else "")
        )
    return ""


def verify(args: argparse.Namespace) -> int:
    try:
        pub = load_public_key(args.public_key)
    except BundleError as exc:
        raise UsageError(f"--public-key: {exc}") from exc
    try:
        manifest = verify_bundle(args.bundle_dir, pub)
    except BundleError as exc:
        print(f"peep bundle verify: FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"bundle {manifest.bundle_id}: OK (signed by key {manifest.key_id}, created {manifest.created_at})")
    return 0


def _names(path: str, option: str) -> list[str]:
    """The people named in ``path``: one a line, blank lines and ``#`` comments ignored."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{option}: expected a readable UTF-8 file of names, received {path!r} ({exc})") from None
    names = [line.split("#", 1)[0].strip() for line in text.splitlines()]
    return [n for n in names if n]


def calibrate(args: argparse.Namespace) -> int:
    from peep.core.bundle import ProjectionBundle
    from peep.core.decision import resolved_share
    from peep.server.bundles.calibrate import CalibrationError, make_calibration, write_calibration
    from peep.server.datasets import DatasetError
    from peep.server.progress import progress_printer

    try:
        pub = load_public_key(args.public_key)
    except BundleError as exc:
        raise UsageError(f"--public-key: {exc}") from exc
    try:
        bundle = ProjectionBundle.load(args.bundle, pub)
    except (BundleError, OSError) as exc:
        raise UsageError(
            f"--bundle: expected a bundle signed by the --public-key key, received {args.bundle!r}: {exc}"
        ) from exc
    for option, value in (("--max-faces", args.max_faces), ("--max-per-person", args.max_per_person)):
        if value is not None and value < 1:
            raise UsageError(f"{option}: expected >= 1, received {value}")
    people = _names(args.people_from, "--people-from") if args.people_from else None
    excluded = [n for path in args.exclude for n in _names(path, "--exclude")]
    t0 = time.perf_counter()
    try:
        proj, tags, domain, kind = make_calibration(
            bundle,
            args.dataset,
            mechanism=args.mechanism,
            data_home=args.data_home,
            min_faces=args.min_faces,
            max_faces=args.max_faces,
            people=people,
            exclude=excluded,
            max_per_person=args.max_per_person,
            progress=progress_printer("detecting and normalising faces"),
        )
        out = write_calibration(
            args.out, projections=proj, people=tags, bundle_id=bundle.bundle_id, domain=domain, mechanism=kind
        )
    except (CalibrationError, DatasetError) as exc:
        raise UsageError(str(exc)) from exc
    print(
        f"calibration {out.sha256[:16]} -> {args.out}\n"
        f"  {out.n_faces} faces of {out.n_people} public people, bundle {bundle.bundle_id}, {domain} ({kind}), "
        f"nc={out.n_components}; {len(set(excluded))} people excluded; {time.perf_counter() - t0:.1f} s\n"
        f"  a device's threshold lets through about {resolved_share(0.01, out.n_people):.2%} of new people for a "
        f"1 % target, {resolved_share(0.001, out.n_people):.3%} for 0.1 % (about 5 / target people make it "
        "within 20 % of the target)",
        file=sys.stdout,
    )
    return 0
