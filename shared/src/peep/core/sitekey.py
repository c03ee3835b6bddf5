"""A site's template key: a secret rotation of the projection, applied before the noise.

Every site projects faces with the same public bundle, so without a key one person's templates from two
sites match each other, and a stolen database is as useful as the public projection of the faces. A site
key is 256 random bits kept on the site's devices and the administrator's enrolment tool, never on the
server. From it, HKDF-SHA256 (RFC 5869) derives

- a Haar-random orthogonal ``K x K`` matrix ``Q`` (the derived bytes seed a generator; this is key
  derivation, not noise: the same key gives the same ``Q`` on every device), and
- a public key id (a short fingerprint) that travels with every template, so that the server can refuse
  templates of another key without ever holding one.

A device releases ``mechanism(Q u)`` where ``u`` is the projector's bounded output. For mechanisms whose
law is rotation-equivariant (the unit-sphere and L2-ball ones: ``M(Q u)`` has the law of ``Q M(u)``),
keyed release is exactly post-processing of an unkeyed one, so ε and δ are unchanged; other mechanisms
(coordinate boxes, L1 balls) are refused by name (:func:`check_keyed_mechanism`).

What the key protects and what it does not is measured by ``peep audit --site-keys``: it makes two
sites' templates unlinkable and a stolen database useless without the key, and it is renewable (a new key
is a new ``Q``); it is a linear secret, so whoever knows enough pairs of clean and released templates of
the same people can estimate it (the audit's attacks say how many).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path
from typing import Final

import numpy as np
from numpy.typing import NDArray

#: Bytes of secret in a site key.
KEY_BYTES: Final = 32
_HEADER: Final = "peep-site-key-v1"
_INFO_ROTATION: Final = b"peep site key: rotation"
_INFO_ID: Final = b"peep site key: public id"


class SiteKeyError(ValueError):
    """A site key file is missing, malformed or readable by others; the message names the file and why."""


def hkdf_sha256(secret: bytes, info: bytes, length: int, salt: bytes = b"") -> bytes:
    """HKDF-SHA256 (RFC 5869): ``length`` bytes derived from ``secret`` for the purpose ``info``."""
    if not 0 < length <= 255 * 32:
        raise ValueError(f"length: expected 1..{255 * 32} bytes, received {length}")
    prk = hmac.new(salt or bytes(32), secret, hashlib.sha256).digest()
    out, block = b"", b""
    for i in range(1, -(-length // 32) + 1):
        block = hmac.new(prk, block + info + bytes([i]), hashlib.sha256).digest()
        out += block
    return out[:length]


class SiteKey:
    """A site's 256-bit template key.

    Parameters
    ----------
    secret : bytes
        Exactly :data:`KEY_BYTES` bytes (:meth:`generate` draws them from the OS CSPRNG).

    Attributes
    ----------
    key_id : str
        Public fingerprint, ``"sk-"`` + 16 hex digits: safe to log, to send and to store.
    """

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes) or len(secret) != KEY_BYTES:
            got = f"{len(secret)} bytes" if isinstance(secret, bytes) else type(secret).__name__
            raise SiteKeyError(f"site key: expected {KEY_BYTES} bytes, received {got}")
        self._secret = secret
        self.key_id = "sk-" + hkdf_sha256(secret, _INFO_ID, 8).hex()
        self._rotations: dict[int, NDArray[np.float64]] = {}

    def __repr__(self) -> str:  # never the secret
        return f"SiteKey(key_id={self.key_id!r})"

    @classmethod
    def generate(cls) -> SiteKey:
        """A new key from the OS CSPRNG."""
        return cls(secrets.token_bytes(KEY_BYTES))

    def rotation(self, n_components: int) -> NDArray[np.float64]:
        """The key's Haar-random orthogonal matrix for ``n_components`` coordinates, shape (K, K).

        Gaussian matrix → QR with the signs of ``R``'s diagonal moved into ``Q`` (Mezzadri 2007), so ``Q`` is
        uniform on the orthogonal group; the generator is seeded from HKDF(key, K), so each K has its own.
        """
        k = int(n_components)
        if k < 1:
            raise ValueError(f"n_components: expected >= 1, received {n_components}")
        if k not in self._rotations:
            seed = int.from_bytes(hkdf_sha256(self._secret, _INFO_ROTATION + b" K=%d" % k, 32), "big")
            z = np.random.Generator(np.random.PCG64(seed)).standard_normal((k, k))
            q, r = np.linalg.qr(z)
            q = q * np.where(np.diag(r) < 0, -1.0, 1.0)
            q.setflags(write=False)
            self._rotations[k] = q
        return self._rotations[k]

    def apply(self, values: NDArray[np.floating]) -> NDArray[np.float64]:
        """``Q u`` for each row ``u`` of ``values`` (shape (n, K) or (K,))."""
        arr = np.asarray(values, dtype=np.float64)
        q = self.rotation(arr.shape[-1])
        out: NDArray[np.float64] = arr @ q.T
        return out

    # -- files ----------------------------------------------------------------------

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write the key to a new file readable by its owner only (mode 0600); never overwrites one."""
        p = Path(path)
        text = (
            "# A PEEP site key. Keep it on this site's devices and the administrator's enrolment tool only:\n"
            "# never on the recognition server. Whoever holds it can undo the templates' rotation.\n"
            f"{_HEADER}:{self._secret.hex()}\n"
        )
        try:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise SiteKeyError(
                f"site key {p}: the file exists (a key is never overwritten; rotate to a new file)"
            ) from None
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(text)
        return p

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SiteKey:
        """Read a key file; refuses one that group or others may read or write (like ssh does)."""
        p = Path(path)
        try:
            st = p.stat()
        except OSError as exc:
            raise SiteKeyError(f"site key {p}: cannot read it ({exc.strerror})") from None
        if not stat.S_ISREG(st.st_mode):
            raise SiteKeyError(f"site key {p}: expected a regular file")
        if st.st_mode & 0o077:
            raise SiteKeyError(
                f"site key {p}: expected mode 0600 (owner only), received {stat.S_IMODE(st.st_mode):04o}; chmod 600 it"
            )
        if st.st_size > 4096:
            raise SiteKeyError(f"site key {p}: expected a small text file, received {st.st_size} bytes")
        lines = [ln.strip() for ln in p.read_text(encoding="ascii", errors="replace").splitlines()]
        keys = [ln for ln in lines if ln and not ln.startswith("#")]
        if len(keys) != 1 or not keys[0].startswith(_HEADER + ":"):
            raise SiteKeyError(f"site key {p}: expected one line '{_HEADER}:<64 hex digits>'")
        digits = keys[0][len(_HEADER) + 1 :]
        try:
            secret = bytes.fromhex(digits)
        except ValueError:
            raise SiteKeyError(f"site key {p}: expected {2 * KEY_BYTES} hex digits after '{_HEADER}:'") from None
        if len(secret) != KEY_BYTES:
            raise SiteKeyError(f"site key {p}: expected {2 * KEY_BYTES} hex digits, received {len(digits)}")
        return cls(secret)
