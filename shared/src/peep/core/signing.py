"""The server's signed statements to a door: its decision on a claim, and whether a claimed subject is known.

A door that takes its decision from the broker (``door.decision = "mqtt"``) acts on a message anyone who may
write its events topic could have written. The broker's ACL lets only the server write there, but a broker
set up without that ACL (or anonymous, or in clear) would let any client forge "accepted" for a claim whose
nonce it read on the templates topic. So the server signs what a door acts on with a key of its own
(Ed25519, ``mqtt.decision_signing_key``, written by ``peep keys generate``), and the door checks it against
the public half pinned in its configuration (``door.decision_public_key``): a client without the server's
key cannot produce a statement the door accepts, whatever the broker lets through.

What is signed is the statement's meaning, not its JSON: a kind, then the site, the door, the claim's nonce,
the claimed subject and the verdict, one a line (every one an identifier, so none holds a line break). The
nonce is the claim's fresh random id, so a statement cannot be replayed onto another claim, and the kind
keeps a "known subject" answer from passing as an "accepted" decision.

Examples
--------
>>> from peep.core.bundle import generate_keypair
>>> from cryptography.hazmat.primitives.serialization import load_pem_private_key
>>> key = load_pem_private_key(generate_keypair()[0], password=None)
>>> s = door_statement("verify", site="hq", device_id="door-1", nonce="ab" * 16, subject="alice", verdict=True)
>>> sig = sign_statement(key, s)
>>> verify_statement(key.public_key(), s, sig)
True
>>> verify_statement(key.public_key(), s.replace(b"alice", b"bob"), sig)
False
"""

from __future__ import annotations

import base64
import binascii
from typing import Final, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

#: What a statement can say: the decision on a claim's face, or whether the claimed subject is enrolled.
StatementKind = Literal["verify", "claim_check"]
_KINDS: Final = ("verify", "claim_check")
_DOMAIN: Final = b"peep-door-statement/v1"
#: Longest signature text accepted (an Ed25519 signature is 64 bytes: 88 characters of base64).
MAX_SIGNATURE_CHARS: Final = 128


def door_statement(kind: StatementKind, *, site: str, device_id: str, nonce: str, subject: str, verdict: bool) -> bytes:
    """The bytes the server signs for ``kind`` (see the module docstring).

    Raises
    ------
    ValueError
        If ``kind`` is not one of the statement kinds, or a field holds a line break or is empty.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind: expected one of {', '.join(_KINDS)}, received {kind!r}")
    fields = {"site": site, "device_id": device_id, "nonce": nonce, "subject": subject}
    for name, value in fields.items():
        if not isinstance(value, str) or not value or "\n" in value:
            raise ValueError(f"{name}: expected a non-empty string without line breaks, received {value!r:.80}")
    if not isinstance(verdict, bool):
        raise TypeError(f"verdict: expected a bool, received {type(verdict).__name__}")
    lines = [kind, site, device_id, nonce, subject, "1" if verdict else "0"]
    return _DOMAIN + b"\n" + "\n".join(lines).encode("utf-8")


def sign_statement(private_key: Ed25519PrivateKey, statement: bytes) -> str:
    """The Ed25519 signature of ``statement`` as base64 text (what travels in the JSON)."""
    return base64.b64encode(private_key.sign(statement)).decode("ascii")


def verify_statement(public_key: Ed25519PublicKey, statement: bytes, signature: object) -> bool:
    """Whether ``signature`` (base64 text, as received: anything) is the pinned key's signature of ``statement``.

    Never raises for what a peer sent: a missing, over-long, undecodable or wrong signature is False.
    """
    if not isinstance(signature, str) or not 0 < len(signature) <= MAX_SIGNATURE_CHARS:
        return False
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    try:
        public_key.verify(raw, statement)
    except InvalidSignature:
        return False
    return True


def sign_document(private_key: Ed25519PrivateKey, domain: bytes, document: bytes) -> str:
    """Base64 Ed25519 signature of ``domain + b"\\n" + document`` (the domain keeps one kind of signed
    document from passing as another, e.g. a device model's manifest as a door statement)."""
    if not domain or b"\n" in domain:
        raise ValueError(f"domain: expected a non-empty single line, received {domain!r:.80}")
    return sign_statement(private_key, domain + b"\n" + document)


def verify_document(public_key: Ed25519PublicKey, domain: bytes, document: bytes, signature: object) -> bool:
    """Whether ``signature`` is the pinned key's :func:`sign_document` signature of ``document``; never raises."""
    return verify_statement(public_key, domain + b"\n" + document, signature)
