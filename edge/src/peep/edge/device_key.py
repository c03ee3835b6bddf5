"""The device's own signing key: what it releases over MQTT can be told from what anyone else publishes.

A broker may let any client publish on a device's templates topic (an open broker with
``insecure_broker = true``, a TLS broker that does not check credentials, a credential stolen from
another device). The server then has only the topic's word for who released a template. So each device
signs every template with an Ed25519 key of its own (:func:`peep.core.signing.sign_template`, over the
template's digest) and the server checks it against the public half registered for the device
(``auth.devices[].signing_key``): a template it cannot verify is refused, counted as no one's release.

The key is 32 random bytes (the Ed25519 seed) in ``<state_dir>/device.key`` (``device.signing_key``),
mode 0600, made on the device's first start; ``peep-edge device-key`` prints the public half in the form
the server's configuration takes. Whoever holds the device's disk holds the key, as with its other
credentials: register a new key (and remove the old) when a device is lost.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from peep.edge.errors import EdgeError

_SEED_BYTES = 32


class SecretFileError(EdgeError):
    """A secret file of the device cannot be used (named in the message): the process does not start."""


def read_or_make_secret(path: str | os.PathLike[str], what: str, *, why_kept: str) -> bytes:
    """The 32 bytes in ``path``, made (random, mode 0600, fsynced) when the file does not exist.

    ``what`` names the secret in errors; ``why_kept`` says what replacing a damaged one would lose.

    Raises
    ------
    SecretFileError
        The file exists with another size.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        secret = path.read_bytes()
        if len(secret) != _SEED_BYTES:
            raise SecretFileError(
                f"{path}: expected the {what}'s {_SEED_BYTES}-byte key, received {len(secret)} bytes; a damaged "
                f"key cannot be replaced silently ({why_kept}): remove it to start afresh"
            ) from None
        return secret
    secret = os.urandom(_SEED_BYTES)
    try:
        os.write(fd, secret)
        os.fsync(fd)
    finally:
        os.close(fd)
    return secret


class DeviceKey:
    """The device's Ed25519 signing key, read from (or made at) ``path``.

    Raises
    ------
    SecretFileError
        The key file exists but is not a 32-byte key.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        seed = read_or_make_secret(
            self.path, "device signing", why_kept="the server knows the device by its public half"
        )
        self._key = Ed25519PrivateKey.from_private_bytes(seed)

    def sign(self, msg: Any) -> None:
        """Set ``msg.device_signature`` (call it last: a field changed afterwards breaks the signature)."""
        from peep.core.signing import sign_template

        sign_template(self._key, msg)

    @property
    def public_text(self) -> str:
        """``ed25519:<base64>``: the line for the server's ``auth.devices[].signing_key``."""
        from peep.core.signing import public_key_text

        return public_key_text(self._key.public_key())
