"""``peep keys generate --out PREFIX``: an Ed25519 signing key pair."""

from __future__ import annotations

import argparse
from typing import Any

from peep.core.bundle import key_id, load_public_key, write_keypair
from peep.server.errors import UsageError


def register(sub: Any) -> None:
    p = sub.add_parser("keys", help="signing keys for projection bundles")
    ksub = p.add_subparsers(dest="keys_command", metavar="ACTION", required=True)
    g = ksub.add_parser("generate", help="write PREFIX.key (mode 0600) and PREFIX.pub")
    g.add_argument("--out", required=True, metavar="PREFIX", help="path prefix of the key files")
    g.set_defaults(handler=generate)


def generate(args: argparse.Namespace) -> int:
    try:
        key_path, pub_path = write_keypair(args.out)
    except FileExistsError as exc:
        raise UsageError(str(exc)) from exc
    print(f"private key: {key_path} (mode 0600; keep it off devices)")
    print(f"public key:  {pub_path} (pin this on every device)")
    print(f"key id:      {key_id(load_public_key(pub_path))}")
    return 0
