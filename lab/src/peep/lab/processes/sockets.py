"""Where a lab part's Unix socket goes when its folder is too deep for a socket address (HAProxy's stats socket,
the soak door's claims socket)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

#: The longest stats socket path HAProxy accepts (``socket path ... too long (max 97)``).
HAPROXY_SOCKET_MAX = 97
#: The longest Unix socket path to bind anywhere else: ``sockaddr_un`` holds 108 bytes; stay clear of it.
SUN_PATH_MAX = 100


class SocketPlace:
    """Where a Unix socket named ``name`` goes: in ``folder``, or, when that path is longer than ``limit`` bytes
    (a deep folder, as under a test's temporary path), in a short folder of its own under the system's temporary
    folder, which :meth:`remove` deletes and :meth:`make` makes again.

    Parameters
    ----------
    folder : Path
    name : str
        The socket file's name.
    limit : int
        The longest path, in bytes, the program binding the socket accepts.
    prefix : str
        The short folder's name prefix (says whose it is).
    """

    def __init__(self, folder: Path, name: str, *, limit: int = SUN_PATH_MAX, prefix: str = "peep-") -> None:
        wanted = folder / name
        self.short_dir: Path | None = None
        if len(os.fsencode(str(wanted))) > limit:
            self.short_dir = Path(tempfile.mkdtemp(prefix=prefix))
            wanted = self.short_dir / name
        self.path = wanted

    def make(self) -> None:
        """Make the short folder again (private to this user) if :meth:`remove` deleted it."""
        if self.short_dir is not None:
            self.short_dir.mkdir(mode=0o700, exist_ok=True)

    def remove(self) -> None:
        """Delete the short folder, the socket in it included (nothing when the socket is in ``folder``)."""
        if self.short_dir is not None:
            shutil.rmtree(self.short_dir, ignore_errors=True)
