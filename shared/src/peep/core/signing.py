"""The server's signed statements to a door: its decision on a claim, and whether a claimed subject is known.

A door that takes its decision from the broker (``door.decision = "mqtt"``) acts on a message anyone who may
write its events topic could have written. The broker's ACL lets only the server write there, but a broker
set up without that ACL (or anonymous, or in clear) would let any client forge "accepted" for a claim whose
nonce it read on the templates topic. So the server signs what a door acts on with a key of its own
(Ed25519, ``mqtt.decision_signing_key``, written by ``peep keys generate``), and the door checks it against
the public half pinned in its configuration (``door.decision_public_key``): a client without the server's
key cannot produce a statement the door accepts, whatever the broker lets through.

What is signed is the statement's meaning, not its JSON: a kind, then the site, the door, the claim's nonce,
the claimed subject and the verdict, one a line (every one an identifier, so none holds a line break), and
for a decision the SHA-256 of the template decided (:func:`peep.core.wire.template_digest`). The nonce is
the claim's fresh random id, so a statement cannot be replayed onto another claim; the digest ties a
decision to one template, so a decision on a template someone else published under the claim's nonce (a
recorded face of the claimed subject) is not the decision on the door's own, whose fresh noise nobody can
predict; and the kind keeps a "known subject" answer from passing as an "accepted" decision.

A device signs its own templates the same way (:func:`sign_template`, with a key of its own whose public
half the server registers), so that a client that may publish on the broker cannot release in its name.

Examples
--------
>>> from peep.core.bundle import generate_keypair
>>> from cryptography.hazmat.primitives.serialization import load_pem_private_key
>>> key = load_pem_private_key(generate_keypair()[0], password=None)
>>> s = door_statement("verify", site="hq", device_id="door-1", nonce="ab" * 16, subject="alice", verdict=True,
...                    template_sha256="0" * 64)
>>> sig = sign_statement(key, s)
>>> verify_statement(key.public_key(), s, sig)
True
>>> verify_statement(key.public_key(), s.replace(b"alice", b"bob"), sig)
False
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any, Final, Literal

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

#: What a statement can say: the decision on a claim's face, or whether the claimed subject is enrolled.
StatementKind = Literal["verify", "claim_check"]
_KINDS: Final = ("verify", "claim_check")
_DOMAIN: Final = b"peep-door-statement/v2"
_TEMPLATE_DOMAIN: Final = b"peep-device-template/v1"
_DIGEST = re.compile(r"[0-9a-f]{64}")
#: Longest signature text accepted (an Ed25519 signature is 64 bytes: 88 characters of base64).
MAX_SIGNATURE_CHARS: Final = 128


def door_statement(kind: StatementKind, *, site: str, device_id: str, nonce: str, subject: str, verdict: bool,
                   template_sha256: str = "") -> bytes:  # fmt: skip
    """The bytes the server signs for ``kind`` (see the module docstring).

    ``template_sha256``: for ``"verify"``, the hex digest of the template decided (required); empty for
    ``"claim_check"``, which answers before any template exists.

    Raises
    ------
    ValueError
        If ``kind`` is not one of the statement kinds, a field holds a line break or is empty, or the digest
        is missing from a decision (or present in a claim check's answer).
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
    if kind == "verify":
        if not isinstance(template_sha256, str) or not _DIGEST.fullmatch(template_sha256):
            raise ValueError(f"template_sha256: expected 64 lowercase hex digits, received {template_sha256!r:.80}")
        lines.append(template_sha256)
    elif template_sha256:
        raise ValueError("template_sha256: a claim check's answer names no template")
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


def template_statement(digest: str) -> bytes:
    """The bytes a device signs for a template whose :func:`peep.core.wire.template_digest` is ``digest``."""
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise ValueError(f"digest: expected 64 lowercase hex digits, received {digest!r:.80}")
    return _TEMPLATE_DOMAIN + b"\n" + digest.encode("ascii")


def sign_template(private_key: Ed25519PrivateKey, msg: Any) -> None:
    """Set ``msg.device_signature`` to the device's signature of the template (every other field final)."""
    from peep.core.wire import template_digest

    msg.ClearField("device_signature")
    msg.device_signature = sign_statement(private_key, template_statement(template_digest(msg)))


def verify_template(public_key: Ed25519PublicKey, msg: Any) -> bool:
    """Whether ``msg.device_signature`` is ``public_key``'s signature of the template; never raises for a
    peer's message (a missing, short or wrong signature is False)."""
    from peep.core.wire import template_digest

    if not msg.device_signature:
        return False
    return verify_statement(public_key, template_statement(template_digest(msg)), msg.device_signature)


#: How a device's public signing key is written in the server's configuration.
DEVICE_KEY_PREFIX: Final = "ed25519:"


def public_key_text(public_key: Ed25519PublicKey) -> str:
    """``ed25519:<base64 of the 32 raw bytes>``: a device's public key as the server's configuration holds it."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = public_key.public_bytes(Encoding.Raw, PublicFormat.Raw)
    return DEVICE_KEY_PREFIX + base64.b64encode(raw).decode("ascii")


def parse_public_key_text(text: str) -> Ed25519PublicKey:
    """The key :func:`public_key_text` wrote.

    Raises
    ------
    ValueError
        Not ``ed25519:`` and the base64 of 32 bytes.
    """
    if not isinstance(text, str) or not text.startswith(DEVICE_KEY_PREFIX):
        raise ValueError(f"expected '{DEVICE_KEY_PREFIX}' and the base64 of 32 bytes, received {str(text)[:80]!r}")
    try:
        raw = base64.b64decode(text[len(DEVICE_KEY_PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"expected base64 after '{DEVICE_KEY_PREFIX}', received {text[:80]!r}") from None
    if len(raw) != 32:
        raise ValueError(f"expected a 32-byte Ed25519 public key, received {len(raw)} bytes")
    return Ed25519PublicKey.from_public_bytes(raw)
