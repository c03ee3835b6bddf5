"""``peep demo [--data-home DIR] [--out DIR]``: the whole system on one machine."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from peep.core.mechanisms import mechanism_class, mechanism_kinds
from peep.core.projections import projection_kinds
from peep.server.errors import UsageError


def _max_faces(text: str) -> int | None:
    """``--public-max-faces``: an image count of at least 5, or ``all`` (no limit)."""
    if text.strip().lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 5:
        raise argparse.ArgumentTypeError(f"expected a number >= 5 or 'all', received {text[:40]!r}")
    return n


def register(sub: Any) -> None:
    from peep.lab.demo.options import DemoOptions as DemoDefaults
    from peep.server.recognition.presets import PRESETS

    p = sub.add_parser(
        "demo",
        help="the whole system on one machine: bundle, server, edge agents, enrolment, training, identify, verify",
    )
    p.add_argument(
        "--data-home", default=None, help="scikit-learn data home holding lfw_home/ (default: $SCIKIT_LEARN_DATA)"
    )
    p.add_argument("--out", default=None, help="output folder (default runs/demo-<time>)")
    p.add_argument("--subjects", type=int, default=10, help="people to enrol (default 10)")
    p.add_argument("--enrol-images", type=int, default=20, help="photos per subject used to enrol (default 20)")
    p.add_argument(
        "--probe-images", type=int, default=6, help="held-out photos per subject the cameras see (default 6)"
    )
    p.add_argument("--strangers", type=int, default=DemoDefaults.strangers,
                   help=f"never-enrolled people the cameras see (default {DemoDefaults.strangers})")  # fmt: skip
    p.add_argument("--cameras", type=int, default=3, help="edge agents watching videos (default 3)")
    d = DemoDefaults
    p.add_argument("--mechanism", default=d.mechanism, choices=mechanism_kinds(),
                   help=f"the devices' mechanism (default {d.mechanism})")  # fmt: skip
    p.add_argument("--epsilon", type=float, default=d.epsilon,
                   help=f"the mechanism's ε (default {d.epsilon:g} per template)")  # fmt: skip
    p.add_argument("--delta", type=float, default=None, help="δ, for kinds that take one (gaussian-l2)")
    p.add_argument("--projection", default=d.projection, choices=projection_kinds(),
                   help=f"what the bundle's projector computes (default {d.projection})")  # fmt: skip
    p.add_argument("--components", type=int, default=None,
                   help="template dimension in the bundle (default 16 when the server decides, 48 when the "
                   "devices do)")  # fmt: skip
    p.add_argument("--decide", choices=["server", "device"], default=d.decide,
                   help=f"where cameras and the door decide: 'server' (a perturbed template per appearance) or "
                   f"'device' (the server's signed model on each device's clean projection; only a randomised "
                   f"label leaves a camera, nothing of the face leaves the door) (default {d.decide})")  # fmt: skip
    p.add_argument("--epsilon-label", type=float, default=d.epsilon_label,
                   help=f"with --decide device: ε of a camera's released label, k-ary randomized response "
                   f"(default {d.epsilon_label:g} per appearance)")  # fmt: skip
    p.add_argument("--fuse-frames", type=int, default=d.fuse_frames, metavar="N",
                   help=f"with --decide device: frames of a track a camera averages before it decides (no ε; "
                   f"default {d.fuse_frames})")  # fmt: skip
    p.add_argument("--choose-from", type=int, default=d.choose_from, metavar="N",
                   help="with --decide device: frames of a track a camera looks at first, fusing the "
                   "--fuse-frames with the largest faces (default: --fuse-frames, the track's first)")  # fmt: skip
    p.add_argument("--min-face-score", type=float, default=d.min_face_score, metavar="S",
                   help="with --decide device: cameras fuse and decide only on faces the detector scored at "
                   "least S (YuNet's score, 0-1; 0: every face; default: 0.9 on --scenes with YuNet, else every "
                   "face)")  # fmt: skip
    p.add_argument("--enrol-as-seen", type=float, default=d.enrol_as_seen, metavar="F",
                   help="with --scenes: the share F of each subject's enrolment photos drawn as the scenes' camera "
                   "sees a face before the desk releases it (same photos, same releases, same ε; default "
                   f"{d.enrol_as_seen:g}: every photo as it is)")  # fmt: skip
    p.add_argument("--device-fpir", type=float, default=d.device_fpir, metavar="T",
                   help=f"with --decide device: the share of public people a camera may name, which it sets its "
                   f"threshold for on the calibration people (the server's training.device_models.fpir; default "
                   f"{d.device_fpir:g})")  # fmt: skip
    p.add_argument("--calibration-people", type=int, default=d.calibration_people, metavar="N",
                   help=f"with --decide device: public one-image people (LFW's singles, when present beside LFW) "
                   f"whose clean projections set the devices' thresholds (default {d.calibration_people}: a "
                   f"1 %% target is resolved to about 1 in N)")  # fmt: skip
    p.add_argument("--mirror", action=argparse.BooleanOptionalAction, default=None,
                   help="fit the projection on mirrored faces too (default: the projection's own default)")  # fmt: skip
    p.add_argument("--preset", default=d.preset, choices=list(PRESETS),
                   help=f"the server's recogniser preset (default {d.preset})")  # fmt: skip
    p.add_argument("--identify-far", type=float, default=d.identify_far,
                   help=f"share of strangers the camera may name (default {d.identify_far:g})")  # fmt: skip
    p.add_argument("--verify-far", type=float, default=d.verify_far,
                   help=f"false-accept rate verification is calibrated for on the enrolment photos "
                   f"(default {d.verify_far:g})")  # fmt: skip
    p.add_argument("--public-max-faces", type=_max_faces, default=d.public_max_faces, metavar="N|all",
                   help=f"fit the bundle on public LFW people with 5 to N images, never enrolled people or "
                   f"strangers (default {d.public_max_faces}: the background population's people; 'all': "
                   f"every public person, ~3,000 more faces to describe on a first run)")  # fmt: skip
    p.add_argument("--no-soft", action="store_true", help="cameras do not release age/gender")
    p.add_argument("--no-site-key", action="store_true",
                   help="release templates without a site key (by default each run makes a fresh one, which the "
                   "devices and the administrator's enrolment rotate every template by; the server sees its id "
                   "only)")  # fmt: skip
    p.add_argument("--no-door", action="store_true",
                   help="skip the door (by default every held-out photo is shown at a door twice, with the "
                   "person's own badge and another subject's, and a mock GPIO lock is driven)")  # fmt: skip
    p.add_argument("--scenes", action="store_true",
                   help="the cameras watch rendered scenes: the same people walking through a room, an entrance "
                   "and a street, several at once, faces 30-160 px, H.264; judged per pass and face height "
                   "against the scenes' ground truth, with annotated frames in the report (needs PyAV; YuNet "
                   "where its file is, else dlib's HOG)")  # fmt: skip
    p.add_argument("--qbbs-epsilon", type=float, default=1.0, help="ε of each QBBS query answer (default 1)")
    p.add_argument("--mqtt", choices=["auto", "on", "off"], default="auto",
                   help="one camera over MQTT when a broker answers on 127.0.0.1:1883 (default auto)")  # fmt: skip
    p.add_argument("--keep", choices=["none", "recognised", "all"], default="none",
                   help="the server's recognition.keep: which identify/verify templates it writes to its database "
                   "after deciding them (default none: decided, then forgotten)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="who is enrolled and who walks past (never the noise)")
    p.add_argument("--console", action="store_true",
                   help="leave the server and its operator console running on the demo's data; prints the URL and "
                   "a one-time admin password (needs peep-server[console]); Ctrl-C stops it")  # fmt: skip
    p.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from peep.lab.demo import Demo, DemoOptions, summary_lines

    for name in (
        "subjects",
        "enrol_images",
        "probe_images",
        "cameras",
        "components",
        "calibration_people",
        "fuse_frames",
        "choose_from",
    ):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: expected >= 1, received {getattr(args, name)}")
    if args.choose_from is not None and args.choose_from < args.fuse_frames:
        raise UsageError(f"--choose-from: expected >= --fuse-frames ({args.fuse_frames}), received {args.choose_from}")
    if args.min_face_score is not None and not 0.0 <= args.min_face_score <= 1.0:
        raise UsageError(f"--min-face-score: expected 0 <= S <= 1, received {args.min_face_score}")
    if not 0.0 <= args.enrol_as_seen <= 1.0:
        raise UsageError(f"--enrol-as-seen: expected 0 <= F <= 1, received {args.enrol_as_seen}")
    if args.enrol_as_seen > 0 and not args.scenes:
        raise UsageError("--enrol-as-seen: draws photos as the scenes' camera sees them; it needs --scenes")
    if args.strangers < 0:
        raise UsageError(f"--strangers: expected >= 0, received {args.strangers}")
    if not args.qbbs_epsilon > 0:
        raise UsageError(f"--qbbs-epsilon: expected > 0, received {args.qbbs_epsilon}")
    if not args.epsilon > 0:
        raise UsageError(f"--epsilon: expected > 0, received {args.epsilon}")
    if not 0 < args.epsilon_label <= 40:
        raise UsageError(f"--epsilon-label: expected 0 < ε <= 40, received {args.epsilon_label}")
    for name in ("identify_far", "verify_far", "device_fpir"):
        if not 0 < getattr(args, name) < 0.5:
            option = "--" + name.replace("_", "-")
            raise UsageError(f"{option}: expected a value in (0, 0.5), received {getattr(args, name)}")
    if mechanism_class(args.mechanism).takes_delta and args.delta is None:
        raise UsageError(f"--delta: expected a value in (0, 1) for --mechanism {args.mechanism}")
    out = Path(args.out) if args.out else Path("runs") / time.strftime("demo-%Y%m%d-%H%M%S")
    opts = DemoOptions(
        out=out,
        data_home=args.data_home,
        subjects=args.subjects,
        enrol_images=args.enrol_images,
        probe_images=args.probe_images,
        strangers=args.strangers,
        cameras=args.cameras,
        mechanism=args.mechanism,
        epsilon=args.epsilon,
        delta=args.delta,
        projection=args.projection,
        components=args.components,
        decide=args.decide,
        epsilon_label=args.epsilon_label,
        fuse_frames=args.fuse_frames,
        choose_from=args.choose_from,
        min_face_score=args.min_face_score,
        enrol_as_seen=args.enrol_as_seen,
        device_fpir=args.device_fpir,
        calibration_people=args.calibration_people,
        mirror=args.mirror,
        preset=args.preset,
        identify_far=args.identify_far,
        verify_far=args.verify_far,
        public_max_faces=args.public_max_faces,
        soft=not args.no_soft,
        door=not args.no_door,
        scenes=args.scenes,
        site_key=not args.no_site_key,
        qbbs_epsilon=args.qbbs_epsilon,
        mqtt=args.mqtt,
        seed=args.seed,
        console=args.console,
        keep=args.keep,
    )
    if args.console:
        from peep.server.console import require_console

        require_console()  # before minutes of work: the extra is installed
    demo = Demo(opts, say=lambda m: print(m, flush=True))
    try:
        summary = demo.run()
    except (ValueError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from exc
    try:
        for line in summary_lines(summary):
            print(line)
        print(f"\nreport: {out / 'report.html'}  summary: {out / 'summary.json'}")
        failed = summary["edge"]["errors"] or summary["edge"]["events_missing"]
        if failed:
            print(f"peep demo: problems: {failed}", file=sys.stderr)
            return 1
        if args.console and demo.console_password:
            from peep.lab.demo.runner import add_user_command

            c = summary["console"]
            print(
                f"\nconsole: {c['url']}  (certificate of the demo's local CA: {c['ca_cert']})\n"
                f"  account {c['account']}, one-time password (shown once; choose your own at first login):\n"
                f"  {demo.console_password}\n"
                f"  the server's configuration: {c['config']}; another account (prints its one-time password):\n"
                f"  {add_user_command(Path(c['config']))}\n"
                "  the server and console keep running on the demo's data; Ctrl-C stops them",
                flush=True,
            )
            _wait_for_stop()
        return 0
    finally:
        demo.close()


def _wait_for_stop() -> None:
    """Block until SIGINT or SIGTERM."""
    import signal
    import threading

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
