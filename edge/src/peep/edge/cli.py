"""``peep-edge``: run the agent, enrol a subject, verify a bundle, list or purge dead letters.

Exit codes: 0 success; 2 usage or configuration error (the message names the
option or the config key); 1 any other failure (the message says what and
where).

::

    peep-edge run --config edge.toml [--validate-config]
    peep-edge enroll --config edge.toml --subject ID --source SRC --count N [--timeout S]
    peep-edge bundle verify BUNDLE_DIR --public-key PUB
    peep-edge deadletter --config edge.toml list [--json]
    peep-edge deadletter --config edge.toml purge [--older-than-days N]

``deadletter`` reads the spool named by the configuration (``spool.path``,
default ``<device.state_dir>/spool.sqlite3``) whether the agent is running or
not (SQLite's locking serialises the two); it never prints a payload. Run it
as the agent's user: the state directory is the agent's alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sqlite3
import sys
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from peep.edge.errors import ConfigError, EdgeError

if TYPE_CHECKING:
    from peep.edge.config import EdgeConfig
    from peep.edge.spool import Spool


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.print_usage(sys.stderr)
        print(f"{self.prog}: usage error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="peep-edge",
        description="PEEP edge agent: publishes perturbed face templates, never pixels",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="capture, detect, track and publish identify templates")
    r.add_argument("--config", required=True, help="edge.toml")
    r.add_argument(
        "--validate-config",
        action="store_true",
        help="check the config (and bundle, secrets, budgets), print the result and exit",
    )
    e = sub.add_parser("enroll", help="publish enrolment templates of one subject (no image is written)")
    e.add_argument("--config", required=True)
    e.add_argument("--subject", required=True, help="operator-supplied subject id")
    e.add_argument("--source", required=True, help="camera index, video file, URL or image folder")
    e.add_argument("--count", required=True, type=int, help="number of templates to release")
    e.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for delivery (default 30)")
    b = sub.add_parser("bundle", help="bundle tools")
    bsub = b.add_subparsers(dest="bundle_command", metavar="ACTION", required=True, parser_class=_Parser)
    v = bsub.add_parser("verify", help="check a bundle's signature and hashes against a pinned key")
    v.add_argument("bundle_dir")
    v.add_argument("--public-key", required=True)
    k = sub.add_parser("site-key", help="the site's template key: generate one, or print a key file's public id")
    ksub = k.add_subparsers(dest="site_key_command", metavar="ACTION", required=True, parser_class=_Parser)
    kg = ksub.add_parser(
        "generate",
        help="write a new 256-bit site key (mode 0600, never overwrites) and print its public id; copy it to the "
        "site's devices and the administrator's enrolment tool, never to the server",
    )
    kg.add_argument("--out", required=True, help="the key file to create")
    ki = ksub.add_parser("id", help="print a key file's public id (what templates and models carry)")
    ki.add_argument("key_file")
    dk = sub.add_parser(
        "device-key",
        help="print this device's public signing key (made on first use) as the server's "
        "auth.devices[].signing_key takes it",
    )
    dk.add_argument("--config", required=True, help="the device's edge.toml (device.signing_key, device.state_dir)")
    dr = sub.add_parser(
        "door",
        help="a door: read claims (one subject id a line), verify the best face of the next seconds with the "
        "server, drive the lock on an accepted decision only (fail-secure)",
    )
    dr.add_argument("--config", required=True, help="edge.toml with an enabled [door] section (and [grpc] or [mqtt] "
                    "for door.decision)")  # fmt: skip
    dr.add_argument(
        "--claims",
        default="-",
        help="where claims come from: '-' (stdin: a keyboard-wedge badge reader types there), 'unix:PATH' (a local "
        "socket this command creates, mode 0660, that an access controller connects to), or a path (a serial "
        "device or a FIFO another access controller writes to)",
    )
    dr.add_argument("--face-timeout", type=float, default=3.0, help="seconds to look for a face (default 3)")
    bg = sub.add_parser(
        "enroll-background",
        help="the administrator's tool: release a folder of public faces (one folder per person) under this "
        "configuration's mechanism and site key, and enrol them as background people with the admin token",
    )
    bg.add_argument("--config", required=True, help="edge.toml of the administrator's machine (its [grpc] target)")
    bg.add_argument("--dataset", required=True, help="folder of per-person folders of public face photos")
    bg.add_argument("--admin-token-env", default="PEEP_ADMIN_TOKEN", help="environment variable holding the admin "
                    "token (default PEEP_ADMIN_TOKEN)")  # fmt: skip
    bg.add_argument("--max-photos", type=int, default=20, help="photos per person at most (default 20)")
    d = sub.add_parser("deadletter", help="list or purge the templates receivers refused (never their payload)")
    d.add_argument("--config", default=None, help="edge.toml (its spool is read)")
    dsub = d.add_subparsers(dest="deadletter_command", metavar="ACTION", required=True, parser_class=_Parser)
    dl = dsub.add_parser("list", help="count, per transport, per reason, oldest/newest, and one line per dead letter")
    dp = dsub.add_parser("purge", help="delete dead letters (all, or those older than --older-than-days)")
    for action in (dl, dp):
        # Also accepted after the action, where `run` and `enroll` users will type it.
        action.add_argument("--config", default=argparse.SUPPRESS, help="edge.toml")
    dl.add_argument("--json", action="store_true", help="one JSON object instead of text")
    dp.add_argument("--older-than-days", type=float, default=None, metavar="N", help="only those failed > N days ago")
    m = sub.add_parser("models", help="model files fetched once and verified by SHA-256 (YuNet's face detector)")
    msub = m.add_subparsers(dest="models_command", metavar="ACTION", required=True, parser_class=_Parser)
    msub.add_parser("list", help="the model files known, with their pinned address, SHA-256 and licence")
    mf = msub.add_parser(
        "fetch",
        help="download a model file (or copy one with --from), keep it only if its SHA-256 is the pinned one, and "
        "print the edge.toml lines that use it",
    )
    mf.add_argument("name", help="the model, e.g. yunet")
    mf.add_argument(
        "--dest", default=None, help="models folder (default $PEEP_MODELS_DIR or ~/.local/share/peep/models)"
    )
    mf.add_argument("--url", default=None, help="another http(s) address serving the same file (a mirror)")
    mf.add_argument("--from", dest="source_file", default=None, metavar="FILE", help="copy this file instead")
    mf.add_argument("--timeout", type=float, default=30.0, help="seconds a download may stall (default 30)")
    return p


def _models(args: argparse.Namespace) -> int:
    from peep.edge.models import MODELS, ModelFetchError, fetch_model

    if args.models_command == "list":
        for model in MODELS.values():
            print(f"{model.name}: {model.filename}, {model.size} bytes, SHA-256 {model.sha256}, {model.licence} "
                  f"({model.source})\n  {model.url}")  # fmt: skip
        return 0
    try:
        path, how = fetch_model(args.name, args.dest, url=args.url, source_file=args.source_file, timeout=args.timeout)
    except ModelFetchError as exc:
        print(f"peep-edge models fetch: error: {exc}", file=sys.stderr)
        return 1
    model = MODELS[args.name]
    print(f"{model.name}: {how}, SHA-256 verified: {path}")
    print("use it in edge.toml:\n" + model.config.format(path=path))
    return 0


def _site_key(args: argparse.Namespace) -> int:
    from peep.core.sitekey import SiteKey, SiteKeyError

    try:
        if args.site_key_command == "generate":
            key = SiteKey.generate()
            path = key.write(args.out)
            print(f"site key {key.key_id} written to {path} (mode 0600)")
        else:
            print(SiteKey.load(args.key_file).key_id)
    except SiteKeyError as exc:
        raise ConfigError(str(exc)) from None
    return 0


def _device_key(args: argparse.Namespace) -> int:
    from peep.edge.config import load_config
    from peep.edge.device_key import DeviceKey, SecretFileError

    cfg = load_config(args.config)
    try:
        key = DeviceKey(cfg.device_key_path)
    except (SecretFileError, OSError) as exc:
        raise ConfigError(f"device.signing_key: {exc}") from None
    print(f"# device {cfg.device.id}'s signing key ({key.path}); in the server's configuration:")
    print("[[auth.devices]]")
    print(f'id = "{cfg.device.id}"')
    print(f'signing_key = "{key.public_text}"')
    return 0


#: Seconds a stopping door waits for its spool to drain (access records; the rest stays for the next start).
DOOR_DRAIN_S = 0.5


def _door(args: argparse.Namespace) -> int:
    """``peep-edge door``: claims → best face → VERIFY release → the server's answer → the lock (fail-secure)."""
    from peep.core.logs import setup_logging
    from peep.edge.agent import Agent
    from peep.edge.capture import open_source
    from peep.edge.config import load_config
    from peep.edge.door_claims import fd_claim_lines, path_claim_lines, serve_claims, socket_claims
    from peep.edge.door_session import open_door

    cfg = load_config(args.config)
    if not cfg.door.enabled:
        raise ConfigError("door.enabled: expected true for peep-edge door, received false")
    if not (0 < args.face_timeout <= 30):
        raise ConfigError(f"--face-timeout: expected 0 < seconds <= 30, received {args.face_timeout}")
    setup_logging(level=cfg.log.level, fmt=cfg.log.format)
    agent = Agent(cfg)
    stop = agent.stop_event
    # Before anything can block: SIGTERM (systemd's stop) and SIGINT end every wait within half a second and
    # the door closes, releasing its lock. A handler that only sets the event: the waits poll it.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.request_stop())

    def report(outcome: Any) -> None:
        if outcome.opened:
            agent.metrics.door_opened.inc()
        else:
            agent.metrics.door_refusals.labels(reason=outcome.reason).inc()
        state = "opened" if outcome.opened else f"locked ({outcome.reason})"
        if outcome.requested_by:  # no claim: Home Assistant's lock asked (door.home_assistant_open)
            print(f"request of {outcome.requested_by}: {state}", flush=True)
            return
        print(f"claim {outcome.claim.subject if outcome.claim else '?'}: {state}", flush=True)

    claims: Any
    try:
        if args.claims == "-":
            claims = fd_claim_lines(sys.stdin.fileno(), stop=stop)
        elif args.claims.startswith("unix:"):
            claims = socket_claims(args.claims[len("unix:") :], stop=stop)
        else:
            claims = path_claim_lines(args.claims, stop=stop)
    except OSError as exc:
        raise EdgeError(f"--claims: cannot read {args.claims[:200]!r}: {exc.strerror or exc}") from None
    # Every outcome, including decisions refused while no claim of theirs waits (another claim's, replayed).
    door = open_door(agent, on_outcome=report, face_timeout_s=args.face_timeout)
    agent.start_transports()  # its reports: what the door spent reaches the server
    if door.link is not None and not door.link.connected.is_set():
        print(f"door {cfg.device.id}: the MQTT broker is not reachable yet; claims stay locked until it is",
              flush=True)  # fmt: skip
    if getattr(agent, "insecure_broker", False):
        weak = " and ".join(cfg.broker_weaknesses())
        print(f"door {cfg.device.id}: WARNING: deciding over MQTT on a broker with {weak} (door.insecure_broker = "
              "true); only the server's signature protects the decisions", file=sys.stderr, flush=True)  # fmt: skip
    controller = door.controller
    # The capture section as `run` reads it: a door over a video file plays it on when capture.loop is set (it
    # read the file once, then every claim ended no_face), and a camera's reconnect settings hold here too.
    c = cfg.capture
    frames = open_source(c.source, max_fps=c.max_fps, width=c.width, height=c.height,
                         reconnect_min_s=c.reconnect_min_s, reconnect_max_s=c.reconnect_max_s,
                         reconnect_attempts=c.reconnect_attempts, stop=stop, loop=c.loop,
                         rtsp_transport=c.rtsp_transport)  # fmt: skip
    opened = 0
    spent = (0.0, 0.0, 0)
    try:
        opened = serve_claims(door.session, claims, frames.read)
    finally:
        agent.begin_stop(DOOR_DRAIN_S)
        door.close()
        frames.close()
        if agent.ledger is not None:
            spent = agent.ledger.lifetime()  # before shutdown closes it
        # A door's releases are not spooled and its access records stay in the spool for the next start, so
        # it drains briefly: with its final report (FINAL_REPORT_BUDGET_S) it is gone within the 5 s its
        # unit promises, even from a server that accepts connections and never answers.
        agent.shutdown(drain_timeout=DOOR_DRAIN_S)
        claims.close()  # the source's generator: closes its descriptor, or removes the socket
    refused = {k: v for k, v in controller.refusals.items() if v}
    print(f"door {cfg.device.id}: {controller.opened} opened, refused {refused or 'none'}")
    vec, coord, n = spent
    print(f"door {cfg.device.id}: ε spent by this device in all: {n} releases, per vector {vec:,.4g}, per "
          f"coordinate {coord:,.4g}")  # fmt: skip
    # A locked door is the door working: the exit code says the door ran, not what it decided.
    print(f"door {cfg.device.id} stopped after {opened} opening(s)", flush=True)
    return 0


MAX_BACKGROUND_PEOPLE = 100_000


def _enroll_background(args: argparse.Namespace) -> int:
    """Public faces released as the devices release theirs, enrolled as ``background:<n>`` by the admin.

    Background people are public photos, never identities: the subject is a number, the folder name is not
    sent. No image leaves this machine; the releases use the secure sampler and, when configured, the site
    key, so the background is in the same rotated space as the desks' enrolments.
    """
    import cv2
    from peep.core.imaging import normalise_face, primary_face
    from peep.core.wire import make_template
    from peep.edge.agent import Agent
    from peep.edge.config import load_config
    from peep.edge.transport.grpc import make_channel
    from peep.v1 import recognition_pb2, recognition_pb2_grpc

    if args.max_photos < 1:
        raise ConfigError(f"--max-photos: expected >= 1, received {args.max_photos}")
    cfg = load_config(args.config)
    if not cfg.grpc.enabled:
        raise ConfigError("grpc.enabled: expected true (background enrolment is an admin gRPC call), received false")
    token = os.environ.get(args.admin_token_env, "")
    if not token:
        raise ConfigError(f"--admin-token-env: expected the admin token in ${args.admin_token_env}, found none")
    root = Path(args.dataset)
    if not root.is_dir():
        raise ConfigError(f"--dataset: expected a folder of per-person folders, received {str(root)[:200]!r}")
    people = sorted(p for p in root.iterdir() if p.is_dir())[:MAX_BACKGROUND_PEOPLE]
    agent = Agent(cfg, environ={})
    agent.prepare()
    releaser = agent.releaser
    channel = make_channel(cfg.grpc)
    stub = recognition_pb2_grpc.RecognitionServiceStub(channel)  # type: ignore[no-untyped-call]
    metadata = [("authorization", f"Bearer {token}")]
    n_people = n_templates = n_skipped = 0
    try:
        for n, person in enumerate(people):
            templates: list[Any] = []
            photos = sorted(f for f in person.iterdir() if f.suffix.lower() in (".jpg", ".jpeg", ".png", ".pgm"))
            found: list[tuple[Any, Any]] = []
            for photo in photos[: args.max_photos]:
                image = cv2.imread(str(photo), cv2.IMREAD_COLOR)
                box = None if image is None else primary_face(agent.detector.detect(image), image.shape)
                if image is None or box is None:
                    n_skipped += 1
                    continue
                found.append((image, box))
            if agent.encoder is not None and found:
                # One batch per person: onnxruntime's network costs less per face in a batch.
                inputs = list(agent.encoder.encode_many(found)) if hasattr(agent.encoder, "encode_many") else [
                    agent.encoder.encode(image, box) for image, box in found]  # fmt: skip
            else:
                inputs = [normalise_face(image, box, releaser.bundle.geometry) for image, box in found]
            for face in inputs:
                values = releaser.release_bounded(releaser.project(face))[0]
                templates.append(
                    make_template(
                        values,
                        device_id=cfg.device.id,
                        site=cfg.device.site,
                        bundle_id=releaser.bundle_id,
                        mechanism=releaser.description,
                        purpose="enroll",
                        subject=f"background:{n}",
                        track_id=f"bg{n}-{len(templates)}",
                        key_id=releaser.key_id,
                    )
                )
            if not templates:
                continue
            stub.EnrolSubject(
                recognition_pb2.EnrolSubjectRequest(subject=f"background:{n}", templates=templates),
                metadata=metadata,
                timeout=cfg.grpc.deadline_s,
            )
            n_people += 1
            n_templates += len(templates)
            if n_people % 25 == 0:
                print(f"  {n_people} of {len(people)} people enrolled ({n_templates} templates)", flush=True)
    finally:
        channel.close()
    key = f"site key {releaser.key_id}" if releaser.key_id else "no site key"
    print(f"enrolled {n_people} background people, {n_templates} templates ({key}; {n_skipped} photos without a face)")
    return 0


def _bundle_verify(args: argparse.Namespace) -> int:
    from peep.core.bundle import ProjectionBundle, load_public_key
    from peep.core.exceptions import BundleError

    try:
        pub = load_public_key(args.public_key)
    except BundleError as exc:
        raise ConfigError(f"--public-key: {exc}") from None
    try:
        bundle = ProjectionBundle.load(args.bundle_dir, pub)
    except BundleError as exc:
        print(f"peep-edge bundle verify: FAILED: {exc}", file=sys.stderr)
        return 1
    print(
        f"bundle {bundle.bundle_id}: OK (signed by key {bundle.manifest.key_id}, created "
        f"{bundle.manifest.created_at}, "
        f"nc={bundle.n_components}, geometry {bundle.geometry.width}x{bundle.geometry.height})"
    )
    return 0


REASON_CHARS = 200


def _printable(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` cut to ``limit`` characters, control characters replaced (a reason is the receiver's text).

    >>> _printable("bad\\x1b[2Jbundle\\n" + "x" * 300)[:12], len(_printable("y" * 300))
    ('bad?[2Jbundl', 200)
    """
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _open_spool(args: argparse.Namespace) -> tuple[EdgeConfig, Spool]:
    from peep.edge.config import load_config
    from peep.edge.spool import Spool

    if not args.config:
        raise ConfigError("--config: expected the agent's edge.toml, received none")
    cfg = load_config(args.config)
    path = cfg.spool_path
    if not path.is_file():
        # Opening would create an empty spool (and its directory) where the agent keeps none.
        raise EdgeError(
            f"spool.path: no spool file at {str(path)!r} (has the agent run with this configuration?); "
            "nothing to list or purge"
        )
    dests = [n for n, on in (("mqtt", cfg.mqtt.enabled), ("grpc", cfg.grpc.enabled)) if on]
    try:
        # Opening applies the configured bounds first, so nothing is listed that should be gone already.
        spool = Spool(
            path,
            destinations=dests,
            max_messages=cfg.spool.max_messages,
            synchronous=cfg.spool.synchronous,
            dead_letter_days=cfg.spool.dead_letter_days,
            dead_letter_max=cfg.spool.dead_letter_max,
        )
    except sqlite3.Error as exc:
        raise EdgeError(f"spool.path: cannot open {str(path)!r}: {exc}") from None
    return cfg, spool


def _deadletter(args: argparse.Namespace) -> int:
    older = getattr(args, "older_than_days", None)
    if older is not None and not (math.isfinite(older) and older >= 0.0):
        raise ConfigError(f"--older-than-days: expected a number of days >= 0, received {older}")
    cfg, spool = _open_spool(args)
    try:
        if args.deadletter_command == "purge":
            n = spool.purge_dead(older_than_days=older)
            scope = "" if older is None else f" older than {older:g} days"
            print(f"purged {n} dead letters{scope} from {spool.path}")
            return 0
        rows = spool.dead()
    except sqlite3.Error as exc:
        raise EdgeError(f"spool.path: {spool.path}: {exc}") from None
    finally:
        spool.close()
    letters = [
        {
            "transport": r["dest"],
            "message_id": r["message_id"],
            "purpose": r["purpose"],
            "reason": _printable(str(r["reason"])),
            "failed": _iso(r["failed"]),
            "failed_unix": round(float(r["failed"]), 3),
        }
        for r in rows
    ]
    failed = [float(r["failed"]) for r in rows]
    per_transport = dict(Counter(d["transport"] for d in letters).most_common())
    per_reason = dict(Counter(d["reason"] for d in letters).most_common())
    report: dict[str, Any] = {
        "spool": str(spool.path),
        "dead_letter_days": cfg.spool.dead_letter_days,
        "dead_letter_max": cfg.spool.dead_letter_max,
        "count": len(letters),
        "oldest": _iso(min(failed)) if failed else None,
        "newest": _iso(max(failed)) if failed else None,
        "per_transport": per_transport,
        "per_reason": per_reason,
        "dead_letters": letters,
    }
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"{len(letters)} dead letters in {spool.path} (kept {cfg.spool.dead_letter_days:g} days, at most "
        f"{cfg.spool.dead_letter_max}; payloads are never shown)"
    )
    if letters:
        print(f"oldest {report['oldest']}, newest {report['newest']}")
        print("per transport: " + ", ".join(f"{t} {n}" for t, n in per_transport.items()))
        print("per reason:")
        for reason, n in per_reason.items():
            print(f"  {n:6d}  {reason}")
        print("transport  message_id  purpose  failed  reason")
        for d in letters:
            print(f"{d['transport']}  {d['message_id']}  {d['purpose']}  {d['failed']}  {d['reason']}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from peep.core.logs import setup_logging
    from peep.edge.agent import Agent
    from peep.edge.config import load_config

    cfg = load_config(args.config)
    agent = Agent(cfg)
    if args.validate_config:
        agent.prepare()
        print(json.dumps({"config": str(args.config), "valid": True, **agent.describe()}, indent=1))
        return 0
    setup_logging(level=cfg.log.level, fmt=cfg.log.format)

    def _stop(signum: int, _frame: FrameType | None) -> None:
        agent.request_stop()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return agent.run()


def _enroll(args: argparse.Namespace) -> int:
    from peep.core.logs import setup_logging
    from peep.edge.agent import Agent
    from peep.edge.config import load_config

    cfg = load_config(args.config)
    setup_logging(level=cfg.log.level, fmt=cfg.log.format)
    agent = Agent(cfg)
    signal.signal(signal.SIGTERM, lambda *_: agent.request_stop())
    rc = agent.enroll(subject=args.subject, source=args.source, count=args.count, timeout_s=args.timeout)
    via = (
        "accepted by the server"
        if cfg.grpc.enabled
        else "acknowledged by the broker (the server's verdict is in its log)"
    )
    print(f"enrolled {args.subject!r}: {args.count} templates {via}")
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "bundle":
            return _bundle_verify(args)
        if args.command == "site-key":
            return _site_key(args)
        if args.command == "enroll-background":
            return _enroll_background(args)
        if args.command == "door":
            return _door(args)
        if args.command == "device-key":
            return _device_key(args)
        if args.command == "run":
            return _run(args)
        if args.command == "deadletter":
            return _deadletter(args)
        if args.command == "models":
            return _models(args)
        return _enroll(args)
    except ConfigError as exc:
        label = "invalid configuration" if getattr(args, "config", None) else "usage error"
        print(f"peep-edge {args.command}: {label}:", file=sys.stderr)
        for path, msg in exc.problems:
            print(f"  {path}: {msg}" if path else f"  {msg}", file=sys.stderr)
        return 2
    except EdgeError as exc:
        print(f"peep-edge {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
