"""``peep-edge``: run the agent, enrol a subject, verify a bundle.

Exit codes: 0 success; 2 usage or configuration error (the message names the
option or the config key); 1 any other failure (the message says what and
where).

::

    peep-edge run --config edge.toml [--validate-config]
    peep-edge enroll --config edge.toml --subject ID --source SRC --count N [--timeout S]
    peep-edge bundle verify BUNDLE_DIR --public-key PUB
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from peep.edge.errors import ConfigError, EdgeError


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
    return p


def _bundle_verify(args: argparse.Namespace) -> int:
    from peep.core.bundle import EigenfaceBundle, load_public_key
    from peep.core.exceptions import BundleError

    try:
        pub = load_public_key(args.public_key)
    except BundleError as exc:
        raise ConfigError(f"--public-key: {exc}") from None
    try:
        bundle = EigenfaceBundle.load(args.bundle_dir, pub)
    except BundleError as exc:
        print(f"peep-edge bundle verify: FAILED: {exc}", file=sys.stderr)
        return 1
    print(
        f"bundle {bundle.bundle_id}: OK (signed by key {bundle.manifest.key_id}, created "
        f"{bundle.manifest.created_at}, "
        f"nc={bundle.n_components}, geometry {bundle.geometry.width}x{bundle.geometry.height})"
    )
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
        if args.command == "run":
            return _run(args)
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
