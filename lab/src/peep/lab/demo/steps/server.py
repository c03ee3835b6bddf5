"""The demo's server step: the recognition server in this process, its clients, its console and its close.

The server runs on loopback (gRPC over TLS, SQLite in the output folder, QBBS; MQTT when a broker answers),
with the run's tokens as digests; :class:`DemoServer` holds what the later steps call it with.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
from peep.core import wire
from peep.core.bundle import ProjectionBundle
from peep.lab.demo.steps.context import DESKS, DOOR, RunContext
from peep.v1 import qbbs_pb2_grpc, recognition_pb2, recognition_pb2_grpc

# The runner's logger, as before the steps were apart: the run's log names it.
log = logging.getLogger("peep.lab.demo.runner")


def add_user_command(config: Path, name: str = "NAME", role: str = "operator") -> str:
    """The ``peep console add-user`` command line that adds a console account on the demo's data.

    >>> add_user_command(Path("runs/demo 1/server/server.toml"))
    "peep console add-user --config 'runs/demo 1/server/server.toml' --name NAME --role operator"
    """
    return f"peep console add-user --config {shlex.quote(str(config))} --name {shlex.quote(name)} --role {role}"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class IdentificationEvents:
    """The server's identification events, by message id: what the cameras' releases were decided as.

    Filled by the server's event sink from its threads; the steps wait on it for the releases they made.
    """

    def __init__(self) -> None:
        self.by_message: dict[str, Any] = {}
        self._cv = threading.Condition(threading.Lock())

    def __call__(self, ev: Any) -> None:
        # Identification events from ingest; Verify calls publish their own events
        # (with a claimed subject) for the same message ids.
        if ev.claimed_subject or ev.purpose != wire.PURPOSES["identify"]:
            return
        with self._cv:
            self.by_message.setdefault(ev.message_id, ev)
            self._cv.notify_all()

    def wait_for(self, message_ids: Iterable[str], timeout_s: float) -> list[str]:
        """Wait up to ``timeout_s`` for an event of every id in ``message_ids``; returns those still missing."""
        wanted = set(message_ids)
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while not wanted <= set(self.by_message) and time.monotonic() < deadline:
                self._cv.wait(timeout=0.5)
        return sorted(wanted - set(self.by_message))


class DemoServer:
    """The running server and the administrator's client of it.

    Attributes
    ----------
    app : ServerApp
        The server (its ``port``, ``console``, ``services``).
    config : dict
        The configuration it was started with (``server.toml``'s sections, ports as asked for).
    pki : LocalPki
        The run's local CA and the server's certificate.
    recognition, qbbs : gRPC stubs
        Clients of the server's services over TLS.
    admin_md : list of (str, str)
        The administrator's call metadata.
    """

    def __init__(self, app: Any, config: dict[str, Any], pki: Any, admin_token: str) -> None:
        self.app, self.config, self.pki = app, config, pki
        creds = grpc.ssl_channel_credentials(root_certificates=pki.ca_cert.read_bytes())
        self.channel = grpc.secure_channel(f"localhost:{app.port}", creds)
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.recognition = recognition_pb2_grpc.RecognitionServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.qbbs = qbbs_pb2_grpc.QbbsServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.admin_md = [("authorization", f"Bearer {admin_token}")]

    @property
    def port(self) -> int:
        """The gRPC port the server bound."""
        return int(self.app.port)

    def stop(self) -> None:
        """Stop the server (and its console)."""
        self.app.stop(1.0)


def server_config(
    ctx: RunContext, pki: Any, *, public_key: Path, bundle_dir: Path, signing_key: Path, calibration: Path | None
) -> dict[str, Any]:
    """The demo's server configuration (``server.toml``'s sections) for a run whose bundle is in ``bundle_dir``."""
    from peep.edge.device_key import DeviceKey

    o, srv = ctx.opts, ctx.out / "server"
    # The desks enrol subjects (enrolment right); the cameras may only identify; the door alone gets the device
    # model's class key. Each device's signing key is made here, where its agent will find it (its state
    # folder's device.key), so the server takes no template over MQTT that its device did not sign.
    devices = [
        {"id": d, "site": ctx.site, "token_sha256": _sha256(t), "enrolment_desk": d in DESKS, "door": d == DOOR,
         "signing_key": DeviceKey(ctx.out / "devices" / d / "device.key").public_text}
        for d, t in ctx.device_tokens.items()
    ]  # fmt: skip
    return {
        "grpc": {
            "listen": "127.0.0.1:0",
            "grace_s": 2.0,
            "tls": {"cert": str(pki.server_cert), "key": str(pki.server_key)},
        },
        "storage": {"backend": "sqlite", "path": str(srv / "peep.db")},
        "bundle": {"public_key": str(public_key), "dir": str(bundle_dir)},
        "auth": {"admin_token_sha256": _sha256(ctx.admin_token), "devices": devices,
                 "require_device_signatures": True},
        "mqtt": {
            "enabled": ctx.use_mqtt,
            "host": "127.0.0.1",
            "port": 1883,
            # No broker user. "" rather than None, which TOML cannot write: the server.toml written for
            # --console says what the server runs with (an empty user name is no user name).
            "username": "",
            "share_group": f"peep-{ctx.site}",
            "client_id": f"peep-{ctx.site}-server",
            # A one-off server on someone's broker: no session outlives it, and it leaves
            # other clients' retained statuses under peep/v1 alone.
            "session_expiry_s": 0,
            "clear_retained": False,
        },
        "training": {
            "model_dir": str(srv / "models"),
            "preset": o.preset,
            "identify_far": o.identify_far,
            "target_far": o.verify_far,
            # Deciding on the devices: every promoted model also goes to them, signed by the deployer's key.
            **({"device_models": {"signing_key": str(signing_key), "calibration": str(calibration),
                                  "fpir": o.device_fpir}}
               if calibration is not None else {}),
        },
        # The door asks about a claim a few times a second, weeks of a real door's traffic in seconds: the
        # server's per-device rate of claim checks is set above it, as the door's own throttles are.
        "recognition": {"keep": o.keep, "claim_checks_per_s": 1000.0, "claim_checks_burst": 1000},
        "metrics": {"enabled": False},
        "logging": {"format": "text", "level": "warning"},
        # Started with the server, so the Live page holds the demo's recognitions.
        **({"console": {"listen": "127.0.0.1:0"}} if o.console else {}),
        "qbbs": {
            "store_path": str(srv / "soft_traits.db"),
            "ledger_path": str(srv / "qbbs_spend.jsonl"),
            "epsilon": o.qbbs_epsilon,
            "epsilon_cap": 1000.0 * o.qbbs_epsilon,
        },
    }  # fmt: skip


def start_server(
    ctx: RunContext,
    events: IdentificationEvents,
    *,
    public_key: Path,
    bundle_dir: Path,
    signing_key: Path,
    calibration: Path | None,
) -> DemoServer:
    """Start the demo's server on loopback; its identification events go to ``events``.

    Parameters
    ----------
    ctx : RunContext
        The run (tokens, site, whether MQTT is used, ``--console``).
    events : IdentificationEvents
        Collects the server's identification events.
    public_key, bundle_dir : Path
        The deployer's public key and the signed bundle the server loads.
    signing_key, calibration : Path, Path or None
        The deployer's private key and the devices' calibration faces: with a calibration, every promoted
        model also goes to the devices, signed (``--decide device``).
    """
    from peep.lab.processes.pki import make_local_pki
    from peep.server.app import ServerApp
    from peep.server.config import parse_config

    pki = make_local_pki(ctx.out / "tls")
    (ctx.out / "server").mkdir(exist_ok=True)
    cfg = server_config(ctx, pki, public_key=public_key, bundle_dir=bundle_dir, signing_key=signing_key,
                        calibration=calibration)  # fmt: skip
    app = ServerApp(parse_config(cfg))  # hosts QBBS: the configuration has [qbbs]
    app.start(mqtt_wait=10.0 if ctx.use_mqtt else None)
    app.services.events.add_sink(events)
    return DemoServer(app, cfg, pki, ctx.admin_token)


def open_console(server: DemoServer, out: Path) -> tuple[dict[str, Any], str]:
    """An admin account with a one-time password on the demo's server; the console stays up until it stops.

    The server's configuration is written next to its database (:func:`write_server_config`), so that
    ``peep console add-user --config`` adds accounts on the demo's data while it runs. Returns the summary's
    ``console`` and the password (printed once, never stored in clear).
    """
    from peep.server.console.accounts import create_account
    from peep.server.console.store import ConsoleStore

    console = server.app.console
    config = write_server_config(server, out)
    password = create_account(ConsoleStore(server.app.services.store), "admin", "admin")
    return {"url": console.url, "account": "admin", "ca_cert": str(server.pki.ca_cert), "config": str(config)}, password


def write_server_config(server: DemoServer, out: Path) -> Path:
    """Write the configuration the demo's server runs with to ``<out>/server/server.toml`` (mode 0600).

    The ports it asked to be chosen (``127.0.0.1:0``) are written as the ones it bound. It holds what the
    running configuration holds: paths, settings and SHA-256 digests of the tokens, never a token.
    """
    from peep.core.configfile import to_toml

    cfg = json.loads(json.dumps(server.config))  # a copy: the bound ports replace the 0s
    cfg["grpc"]["listen"] = f"127.0.0.1:{server.app.port}"
    if server.app.console is not None:
        cfg["console"]["listen"] = f"127.0.0.1:{server.app.console.port}"
    path = out / "server" / "server.toml"
    header = (
        "# The server configuration `peep demo --console` runs with, written by the demo.\n"
        "# grpc.listen and console.listen hold the ports the demo's server bound (it asked for port 0): while\n"
        "# the demo runs, `peep serve --config` on this file finds them taken; set them, or 0, to serve again.\n"
        "# Secrets are not in it: auth holds SHA-256 digests of the admin's and the devices' tokens.\n"
        f"# {add_user_command(path)}\n\n"
    )
    # 0600 from the start, and again for a file an earlier run left with another mode.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(header + to_toml(cfg))
    return path


def clear_broker(site: str, bundle: ProjectionBundle) -> None:
    """Clear what the run left retained: its devices' statuses (its own site) and its bundle announcement.

    The bundle topic is shared by everything under ``peep/v1`` on this broker: it is cleared only
    while it still holds this run's bundle.
    """
    from peep.core.topics import TopicScheme
    from peep.lab.processes.retained import clear_retained, retained_topics

    topics = TopicScheme()
    try:
        left = list(retained_topics(f"{topics.root}/{site}/#"))
        held = retained_topics(topics.bundle).get(topics.bundle)
        if held is not None and recognition_pb2.BundleFiles.FromString(held).bundle_id == bundle.bundle_id:
            left.append(topics.bundle)
        clear_retained(left)
    except Exception as exc:  # the demo's result does not depend on it
        log.warning("demo: could not clear its retained messages on the broker", extra={"error": str(exc)})
