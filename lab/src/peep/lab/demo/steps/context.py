"""What every step of the demo shares: its options, its output folder, the site's identity and tokens."""

from __future__ import annotations

import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from peep.lab.demo.logfile import LOG_FILE
from peep.lab.demo.options import DemoOptions

ADMIN_TOKEN_ENV = "PEEP_DEMO_ADMIN_TOKEN"
DEVICE_TOKEN_ENV = "PEEP_DEMO_DEVICE_TOKEN"
# Off a terminal, a long step's progress line at least this often (seconds), so that no step looks stuck.
HEARTBEAT_S = 8.0
# The site's enrolment desks (the first also stands for the administrator's background enrolment).
DESKS = ("desk-1", "desk-2")
# The door: a camera with a badge reader, asking the server's Verify (the verify right every device has).
DOOR = "door-1"


def camera_ids(opts: DemoOptions) -> list[str]:
    """The cameras' device ids, ``cam-1`` to ``cam-<cameras>``."""
    return [f"cam-{i + 1}" for i in range(opts.cameras)]


def broker_reachable(host: str = "127.0.0.1", port: int = 1883) -> bool:
    """Whether an MQTT broker accepts a TCP connection on ``host:port`` within a second."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return True
    except OSError:
        return False


@dataclass(frozen=True)
class RunContext:
    """What every step of one demo run reads: nothing in it changes once the run has started.

    Attributes
    ----------
    opts : DemoOptions
        The run's options.
    say : callable
        Where progress lines go.
    site : str
        The run's site name (a fresh one per run: its devices' retained statuses are its own).
    admin_token : str
        The administrator's bearer token.
    device_tokens : dict of device id -> bearer token
        One token per device: the server maps a token to exactly one device id.
    use_mqtt : bool
        Whether the server and the last camera use the broker on 127.0.0.1:1883.
    """

    opts: DemoOptions
    say: Callable[[str], None] = print
    site: str = field(default_factory=lambda: f"demo-{secrets.token_hex(2)}")
    admin_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    device_tokens: dict[str, str] = field(default_factory=dict)
    use_mqtt: bool = False

    @classmethod
    def new(cls, opts: DemoOptions, say: Callable[[str], None] = print) -> RunContext:
        """A context with a fresh site name, an administrator token and a token for each of the run's devices."""
        devices = [*DESKS, *camera_ids(opts), DOOR]
        return cls(opts=opts, say=say, device_tokens={d: secrets.token_urlsafe(24) for d in devices})

    @property
    def out(self) -> Path:
        """The run's output folder (``--out``)."""
        return Path(self.opts.out)

    @property
    def log_path(self) -> Path:
        """The run's log, where the server and every device process write."""
        return self.out / LOG_FILE

    def device_job(self, device_id: str, kind: str, work: dict[str, Any]) -> Any:
        """A :class:`~peep.lab.demo.devices.DeviceJob` for ``device_id``, with its token and the run's log."""
        from peep.lab.demo.devices import DeviceJob

        return DeviceJob(device_id, kind, {DEVICE_TOKEN_ENV: self.device_tokens[device_id]}, work, str(self.log_path))
