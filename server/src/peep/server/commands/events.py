"""``peep events --server HOST:PORT --ca CA.pem --token-file FILE``: follow recognition events, one JSON line each.

Calls ``StreamEvents`` on a server (a replica, or the balancer in front of
several) and prints each event as the JSON the MQTT events topic carries, with
its ``seq``. When the stream is lost (a replica gone, the connection reset)
it calls again with the last ``seq`` printed, so the output has every kept
event once and in order; ``--after-seq N`` starts after an earlier run's last
``seq``. The token is read from a file (never the command line, which other
users of the host can see).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from peep.server.errors import UsageError

_MAX_TOKEN = 4096


def register(sub: Any) -> None:
    p = sub.add_parser(
        "events",
        help="follow recognition events from a server or balancer (JSON lines with seq; resumes after a lost stream)",
    )
    p.add_argument("--server", required=True, metavar="HOST:PORT", help="the gRPC address (a replica or the balancer)")
    p.add_argument("--ca", required=True, type=Path, help="PEM file of the CA that signed the server's certificate")
    p.add_argument("--token-file", required=True, type=Path, help="file holding an admin's or a device's token")
    p.add_argument("--cert", type=Path, default=None, help="client certificate (PEM), where the server requires one")
    p.add_argument("--key", type=Path, default=None, help="the client certificate's private key (PEM)")
    p.add_argument("--server-name", default=None, help="the name in the server's certificate, if not HOST")
    p.add_argument("--site", default="", help="only this site's events (default: every site the token may see)")
    p.add_argument("--after-seq", type=int, default=0, help="start after this seq (default 0: from now on)")
    p.add_argument("--count", type=int, default=0, help="stop after this many events (default 0: until interrupted)")
    p.set_defaults(handler=events)


def _read(path: Path, option: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{option}: expected a readable file, received {str(path)[:200]!r} ({exc.strerror})") from None


def events(args: argparse.Namespace) -> int:
    import grpc
    from peep.server.ingest.events import event_to_json
    from peep.server.transport.follow import EventFollower
    from peep.v1 import recognition_pb2_grpc

    host, sep, port = args.server.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--server: expected HOST:PORT, received {args.server[:200]!r}")
    if args.after_seq < 0:
        raise UsageError(f"--after-seq: expected a seq >= 0, received {args.after_seq}")
    if args.count < 0:
        raise UsageError(f"--count: expected a number of events >= 0, received {args.count}")
    if (args.cert is None) != (args.key is None):
        raise UsageError("--cert/--key: expected both (a client certificate and its key) or neither")
    token = _read(args.token_file, "--token-file").strip()
    if not token or len(token) > _MAX_TOKEN or b"\n" in token:
        raise UsageError(f"--token-file: expected one line of at most {_MAX_TOKEN} bytes, received {len(token)} bytes")
    creds = grpc.ssl_channel_credentials(
        root_certificates=_read(args.ca, "--ca"),
        private_key=_read(args.key, "--key") if args.key else None,
        certificate_chain=_read(args.cert, "--cert") if args.cert else None,
    )
    options = [("grpc.ssl_target_name_override", args.server_name)] if args.server_name else []
    channel = grpc.secure_channel(args.server, creds, options=options)
    stub = recognition_pb2_grpc.RecognitionServiceStub(channel)
    follower = EventFollower(
        lambda: stub,
        site=args.site,
        metadata=[("authorization", f"Bearer {token.decode(errors='replace')}")],
        after_seq=args.after_seq,
        on_gap=lambda after, oldest: print(
            f"peep events: the server no longer keeps every event after seq {after} (its oldest is {oldest}: "
            "recognition.events_days or an erasure deleted older ones); events between may be missing",
            file=sys.stderr,
            flush=True,
        ),
        on_lost=lambda code, details: print(
            f"peep events: stream lost ({code}: {details[:200]}); calling again after seq {follower.last_seq}",
            file=sys.stderr,
            flush=True,
        ),
    )
    printed = 0
    try:
        for ev in follower:
            doc = {"seq": ev.seq, **event_to_json(ev)}
            sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
            sys.stdout.flush()
            printed += 1
            if args.count and printed >= args.count:
                break
    except grpc.RpcError as exc:
        raise RuntimeError(
            f"StreamEvents at {args.server[:200]}: {exc.code().name} {str(exc.details())[:300]} "
            f"(after seq {follower.last_seq})"
        ) from None
    finally:
        follower.stop()
        channel.close()
        if follower.reconnects:
            print(
                f"peep events: the stream was lost and called again {follower.reconnects} time(s); last seq "
                f"{follower.last_seq}",
                file=sys.stderr,
            )
    return 0
