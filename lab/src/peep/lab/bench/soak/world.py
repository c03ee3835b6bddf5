"""The soak's running system: every real part on the loopback, the load on it, and the faults it takes.

Built by :meth:`SoakWorld.start`: PostgreSQL (a cluster of the run's own), the shipped Mosquitto (TLS,
passwords, ACL), two ``peep serve`` replicas on that database and broker behind the shipped HAProxy
configuration, and three cameras — real ``peep-edge run`` processes over composed videos played in a loop,
two over gRPC through the balancer and one over MQTT — each behind a TCP proxy of its own so its network path
can be cut. The subjects are enrolled and a model trained before the cameras start. A subscriber follows the
decision events through the balancer, calling again with its last ``seq`` when its stream breaks.

The faults of :mod:`peep.lab.bench.soak.nemesis` are injected here (:meth:`SoakWorld.inject`) and a
recovery is the system deciding again with every spool drained (:meth:`SoakWorld.recovered`). At the end,
:meth:`SoakWorld.histories` reads what each party kept: the cameras' ledgers and spools, the database's
decisions, the subscriber's deliveries.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peep.core.configfile import to_toml
from peep.lab.bench.soak.history import DeviceHistory
from peep.lab.bench.soak.nemesis import Fault
from peep.lab.processes.control import unit_environment
from peep.lab.processes.haproxy import Balancer
from peep.lab.processes.mosquitto import ShippedMosquitto
from peep.lab.processes.ports import free_port
from peep.lab.processes.postgres import PostgresCluster
from peep.lab.processes.replica import Replica
from peep.lab.processes.tcpproxy import TcpProxy

PEEP_EDGE = str(Path(sys.executable).parent / "peep-edge")
#: The cameras: id -> transport. Two over gRPC through the balancer, one over MQTT through the broker.
CAMERAS: dict[str, str] = {"cam-1": "grpc", "cam-2": "grpc", "cam-3": "mqtt"}
REPLICAS = ("a", "b")
#: How often the replicas delete what is past its retention (and sweep track memory).
RETENTION_INTERVAL_S = 10.0
#: The enrolment desk: a device allowed to enrol people, nothing more.
DESK = "desk-1"
#: The fault kinds this world injects (the others are refused by name at scheduling).
KINDS = ("replica_kill", "replica_term", "broker_restart", "postgres_fast", "postgres_immediate", "camera_kill",
         "network_cut", "disk_full", "clock_step")  # fmt: skip
#: The door: a real peep-edge door over a camera of its own, taking a claim every few seconds.
DOOR = "door-1"
#: A camera's state folder is a filesystem of this many MiB (the disk_full fault fills it).
STATE_DISK_MB = 16
#: How far the clock_step fault moves a camera's wall clock (past the server's allowed skew of 300 s).
CLOCK_STEP_S = 600.0
#: Each process runs with its shipped unit's environment (deploy/systemd), as a deployment runs it.
SERVER_UNIT = "peep-server.service"
EDGE_UNIT = "peep-edge.service"


@dataclass
class Camera:
    """One camera process: its configuration, state folder, proxy and the process while it runs."""

    device_id: str
    transport: str
    config: Path
    state_dir: Path
    proxy: TcpProxy
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    def start(self) -> None:
        with open(self.log, "ab") as out:
            env = {**os.environ, **unit_environment(EDGE_UNIT), **self.env}
            argv = [PEEP_EDGE, "run", "--config", str(self.config)]
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
        self.starts += 1

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def queued(self) -> int | None:
        """Templates still in the spool (None while it cannot be read)."""
        try:
            with sqlite3.connect(f"file:{self.state_dir / 'spool.sqlite3'}?mode=ro", uri=True, timeout=2) as db:
                return int(db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])
        except sqlite3.Error:
            return None


class SoakWorld:
    """The system under soak. Parameters: ``out`` (its folder), ``seed``, ``data_home``, ``say``, ``fps``."""

    def __init__(self, out: Path, *, seed: int, data_home: str | None, say: Callable[[str], None],
                 fps: float = 8.0, retention_s: float = 600.0) -> None:  # fmt: skip
        self.out, self.seed, self.data_home, self.say, self.fps = out, seed, data_home, say, fps
        self.retention_s = retention_s
        self.admin = secrets.token_urlsafe(24)
        self.tokens = {d: secrets.token_urlsafe(24) for d in (*CAMERAS, DESK, DOOR)}
        self.console_ports = {n: free_port() for n in REPLICAS}
        self.mqtt_passwords = {d: secrets.token_urlsafe(16) for d, t in CAMERAS.items() if t == "mqtt"}
        self.server_password = secrets.token_urlsafe(16)
        self.site = f"soak-{secrets.token_hex(2)}"
        self.pg: PostgresCluster | None = None
        self.broker: ShippedMosquitto | None = None
        self.replicas: dict[str, Replica] = {}
        self.balancer: Balancer | None = None
        self.cameras: dict[str, Camera] = {}
        self.received: list[tuple[int, str, float, str, str]] = []  # (seq, event_id, time, device, message)
        self._follow_stop = threading.Event()
        self._follower: threading.Thread | None = None
        self.bundle: Any = None
        self.pki: Any = None
        self.enrolled: list[str] = []
        self.lfw: dict[str, list[Path]] = {}
        self.door: Any = None
        self.disks: dict[str, Any] = {}
        self.clocks: dict[str, Any] = {}
        #: Fault kinds this machine cannot inject, with why (no root for a mount, no libfaketime, ...).
        self.unavailable: dict[str, str] = {}
        self.deadletters: Any = None
        self._baselines: dict[Fault, int] = {}

    # ------------------------------------------------------------------ building it

    def start(self) -> SoakWorld:
        from peep.lab.processes.pki import make_local_pki

        self.out.mkdir(parents=True, exist_ok=True)
        self.pki = make_local_pki(self.out / "pki")
        self.say("    PostgreSQL (its own cluster), Mosquitto (the shipped configuration)")
        self.pg = PostgresCluster(self.out / "postgres").start()
        self.broker = ShippedMosquitto(self.out / "broker", self.pki.ca_cert, self.pki.server_cert, self.pki.server_key,
                                       devices=self.mqtt_passwords, server_password=self.server_password,
                                       sys_interval_s=1).start()  # fmt: skip
        people = self.lfw = self._bundle()
        self.say(f"    replicas {', '.join(REPLICAS)} behind HAProxy")
        self._replicas()
        self._enrol_and_train(people)
        self._cameras(people)
        self._door(people)
        self._follow_deadletters()
        self._follower = threading.Thread(target=self._follow, name="soak-events", daemon=True)
        self._follower.start()
        return self

    def _bundle(self) -> dict[str, list[Path]]:
        """A signed eigenfaces bundle fitted on public LFW people; returns LFW's people by name."""
        from peep.core.bundle import load_private_key, write_keypair
        from peep.edge.testing import build_bundle_from_images

        people = self.people()
        key, pub = write_keypair(self.out / "keys" / "site")
        self.pub = pub
        rare = sorted(n for n, p in people.items() if len(p) < 10)
        public = [img for n in rare[:80] for img in people[n][:3]]
        self.bundle_dir = build_bundle_from_images(public, n_components=16, signing_key=load_private_key(key),
                                                   out_dir=self.out / "bundle")  # fmt: skip
        return people

    def _replica_config(self, name: str, grpc_port: int, metrics_port: int) -> dict[str, Any]:
        from peep.edge.device_key import DeviceKey
        from peep.server.config import token_sha256

        assert self.pg is not None and self.broker is not None
        return {
            "storage": {"backend": "postgres", "dsn": self.pg.dsn, "pool_size": 4},
            "bundle": {"public_key": str(self.pub), "dir": str(self.bundle_dir)},
            "auth": {
                "admin_token_sha256": token_sha256(self.admin),
                # Each device's signing key made where its agent finds it: the replicas take no MQTT template a
                # device did not sign.
                "devices": [
                    {"id": d, "site": self.site, "token_sha256": token_sha256(t), "enrolment_desk": d == DESK,
                     "signing_key": DeviceKey(self._key_path(d)).public_text}
                    for d, t in self.tokens.items()
                ],
                "require_device_signatures": True,
            },
            # Retention on a short window, swept often: it races ingest all run long. Decisions and alerts go
            # after `retention_s`; identify templates are never kept (the default), track memory expires.
            "recognition": {"events_days": self.retention_s / 86_400.0},
            "retention": {"interval_s": RETENTION_INTERVAL_S},
            "console": {"listen": f"127.0.0.1:{self.console_ports[name]}"},
            "mqtt": self.broker.server_mqtt_section(share_group=f"peep-{self.site}", client_id=f"soak-{name}"),
            "grpc": {"listen": f"127.0.0.1:{grpc_port}", "grace_s": 2.0,
                     "tls": {"cert": str(self.pki.server_cert), "key": str(self.pki.server_key)}},
            "cluster": {"replica_id": f"soak-{name}"},
            "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
            "training": {"preset": "lda", "model_dir": str(self.out / "models")},
            "logging": {"format": "json", "level": "info"},
        }  # fmt: skip

    def _key_path(self, device: str) -> Path:
        """Where ``device``'s agent finds its signing key: a camera's outside its state folder, which a small
        filesystem is mounted over later (the disk-full fault); the desk's and the door's where they make it."""
        if device in CAMERAS:
            return self.out / "device-keys" / f"{device}.key"
        return (
            self.out / "door" / "state" / "device.key"
            if device == DOOR
            else self.out / "devices" / device / "device.key"
        )

    def _replicas(self) -> None:
        env = {**os.environ, **unit_environment(SERVER_UNIT), "PEEP_MQTT_PASSWORD": self.server_password}
        ports = []
        for name in REPLICAS:
            gport, mport = free_port(), free_port()
            conf = self.out / f"replica-{name}.toml"
            conf.write_text(to_toml(self._replica_config(name, gport, mport)))
            self.replicas[name] = Replica(name, conf, gport, env, mqtt=True).start()
            ports.append((f"replica-{name}", gport, mport))
        self.balancer = Balancer(self.out / "balancer", cert=self.pki.server_cert, key=self.pki.server_key,
                                 ca=self.pki.ca_cert, replicas=ports).start()  # fmt: skip

    def stub(self) -> Any:
        from peep.lab.bench.cluster import grpc_stub

        assert self.balancer is not None
        return grpc_stub(self.balancer.port, str(self.pki.ca_cert))

    @property
    def admin_md(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.admin}")]

    def _enrol_and_train(self, people: dict[str, list[Path]]) -> None:
        """Four subjects and a public background enrolled by the administrator, a model trained and promoted."""
        from peep.core import wire
        from peep.core.bundle import ProjectionBundle, load_public_key
        from peep.core.release import TemplateReleaser
        from peep.server.datasets import load_dataset
        from peep.v1 import recognition_pb2

        frequent = sorted(n for n, p in people.items() if len(p) >= 20)
        self.enrolled = frequent[:4]
        background = sorted(n for n, p in people.items() if 5 <= len(p) < 10)[80:140]
        bundle = ProjectionBundle.load(self.bundle_dir, load_public_key(self.pub))
        releaser = TemplateReleaser(bundle, kind="privunit", epsilon=16.0)
        ds = load_dataset("lfw", data_home=self.data_home, min_faces=5, people=self.enrolled + background,
                          geometry=bundle.geometry, max_per_subject=12)  # fmt: skip
        values = releaser.release(ds.inputs(bundle.input_kind))
        groups: dict[str, list[Any]] = {}
        for i, (row, label) in enumerate(zip(values, ds.labels, strict=True)):
            name = ds.target_names[int(label)].replace(" ", "_")
            subject = name if name in self.enrolled else f"background:{int(label)}"
            groups.setdefault(subject, []).append(
                wire.make_template(row, device_id="admin", site=self.site, bundle_id=bundle.bundle_id,
                                   mechanism=releaser.description, purpose="enroll", subject=subject,
                                   track_id=f"e{i}")
            )  # fmt: skip
        stub = self.stub()
        for subject, msgs in groups.items():
            stub.EnrolSubject(recognition_pb2.EnrolSubjectRequest(subject=subject, templates=msgs),
                              metadata=self.admin_md, timeout=60)  # fmt: skip
        resp = stub.Train(recognition_pb2.TrainRequest(), metadata=self.admin_md, timeout=600)
        self.say(f"    enrolled {len(self.enrolled)} subjects and {len(groups) - len(self.enrolled)} background "
                 f"people; model {resp.model_version}")  # fmt: skip

    def _cameras(self, people: dict[str, list[Path]]) -> None:
        """Each camera's composed video (enrolled people and strangers walking past), config and process."""
        from peep.edge.testing import FaceTrack, compose_video

        assert self.balancer is not None and self.broker is not None
        strangers = sorted(n for n, p in people.items() if 5 <= len(p) < 10)[140:200]
        for k, (device, transport) in enumerate(CAMERAS.items()):
            faces = [people[n][-1] for n in self.enrolled] + [people[n][0] for n in strangers[k::3][:8]]
            # One face after another, each on its own side of the frame with a gap between them: each
            # appearance a track of its own (at one place, the tracker would carry one track through them all).
            tracks = [FaceTrack(image=img, start=i * 12, stop=i * 12 + 8, x0=130 if i % 2 else 330, y0=140,
                                amplitude=20, period_frames=40) for i, img in enumerate(faces)]  # fmt: skip
            video = self.out / "videos" / f"{device}.mp4"
            video.parent.mkdir(parents=True, exist_ok=True)
            compose_video(video, tracks, n_frames=12 * len(faces), fps=10.0, seed=self.seed + k)
            target = ("127.0.0.1", self.balancer.port) if transport == "grpc" else ("127.0.0.1", self.broker.dev_port)
            proxy = TcpProxy(0, target)
            state = self.out / "devices" / device
            cfg = {
                "device": {"id": device, "site": self.site, "state_dir": str(state),
                           "signing_key": str(self._key_path(device))},
                "bundle": {"path": str(self.bundle_dir), "public_key": str(self.pub), "accept_updates": False},
                "privacy": {"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e9, "releases_per_window": 1,
                            "window_seconds": 60.0, "min_track_frames": 3},
                "capture": {"source": str(video), "max_fps": self.fps, "loop": True},
                "spool": {"synchronous": "full", "drain_timeout_s": 10.0},
                "mqtt": {"enabled": transport == "mqtt", "host": "localhost", "port": proxy.port, "tls": True,
                         "ca_file": str(self.pki.ca_cert), "password_env": "PEEP_SOAK_MQTT_PASSWORD",
                         "topic_prefix": "peep/v1"},
                "grpc": {"enabled": transport == "grpc", "target": f"localhost:{proxy.port}", "tls": True,
                         "ca_file": str(self.pki.ca_cert), "token_env": "PEEP_SOAK_TOKEN"},
                "metrics": {"port": 0},
                "log": {"level": "warning", "format": "json"},
            }  # fmt: skip
            conf = self.out / f"{device}.toml"
            conf.write_text(to_toml(cfg))
            env = {"PEEP_SOAK_TOKEN": self.tokens[device], **self._edge_faults(device, state)}
            if device in self.mqtt_passwords:
                env["PEEP_SOAK_MQTT_PASSWORD"] = self.mqtt_passwords[device]
            cam = Camera(device, transport, conf, state, proxy, env, self.out / f"{device}.log")
            cam.start()
            self.cameras[device] = cam
        self.say(f"    cameras {', '.join(f'{d} ({t})' for d, t in CAMERAS.items())}, videos in a loop at "
                 f"{self.fps:g} frames/s")  # fmt: skip

    def _edge_faults(self, device: str, state: Path) -> dict[str, str]:
        """The camera's state folder a small filesystem, its wall clock steppable; returns the clock's environment.

        Either part missing on this machine leaves its fault kind out, with the reason (:attr:`unavailable`).
        """
        from peep.lab.bench.soak.edgefaults import LimitedFolder, SteppedClock
        from peep.lab.processes.control import PartUnavailable

        if "disk_full" not in self.unavailable:
            try:
                self.disks[device] = LimitedFolder(state, size_mb=STATE_DISK_MB).mount()
            except PartUnavailable as exc:
                self.unavailable["disk_full"] = str(exc)
        if "clock_step" not in self.unavailable:
            try:
                clock = SteppedClock(self.out / "clocks", name=device)
                self.clocks[device] = clock
                return clock.env()
            except PartUnavailable as exc:
                self.unavailable["clock_step"] = str(exc)
        return {}

    def kinds(self) -> tuple[str, ...]:
        """The fault kinds this world can inject here (after :meth:`start`)."""
        return tuple(k for k in KINDS if k not in self.unavailable)

    def _door(self, people: dict[str, list[Path]]) -> None:
        from peep.lab.bench.soak.door import SoakDoor

        assert self.balancer is not None
        self.door = SoakDoor(self.out / "door", site=self.site, device_id=DOOR, token=self.tokens[DOOR],
                             bundle_dir=self.bundle_dir, public_key=self.pub, ca_cert=self.pki.ca_cert,
                             target=("127.0.0.1", self.balancer.port), enrolled=self.enrolled, people=people,
                             seed=self.seed, fps=self.fps).prepare()  # fmt: skip
        self.door.start()
        self.say(f"    door {DOOR} (gRPC through its own proxy), claims every few seconds")

    def _follow_deadletters(self) -> None:
        from peep.lab.bench.soak.actors import DeadLetterFollower

        assert self.broker is not None
        follower = DeadLetterFollower("localhost", self.broker.srv_port, self.pki.ca_cert, self.server_password,
                                      topic="devices/peep/v1/deadletter")  # fmt: skip
        self.deadletters = follower.start()

    # ------------------------------------------------------------------ the other users

    def desk(self, people: dict[str, list[Path]], *, interval_s: float, clock: Callable[[], float]) -> Any:
        """The enrolment desk (not started): people no other part of the soak shows, one every ``interval_s``."""
        from peep.lab.bench.soak.actors import EnrolmentDesk

        assert self.balancer is not None
        names = sorted(n for n, p in people.items() if 5 <= len(p) < 10)[200:]
        folders = []
        for n in names:
            folder = self.out / "desk-people" / n
            folder.mkdir(parents=True, exist_ok=True)
            for img in people[n]:  # every photo: a few have no face the detector finds
                link = folder / img.name
                if not link.exists():
                    link.symlink_to(img)
            folders.append((n, folder))
        cfg = {
            "device": {"id": DESK, "site": self.site, "state_dir": str(self.out / "devices" / DESK)},
            "bundle": {"path": str(self.bundle_dir), "public_key": str(self.pub), "accept_updates": False},
            "privacy": {"mechanism": "privunit", "epsilon": 16.0, "track_budget": 1e9},
            # Each enrolment names its person's folder (--source); this is only the configuration's default.
            "capture": {"source": str(folders[0][1]) if folders else str(self.out)},
            "grpc": {"enabled": True, "target": f"localhost:{self.balancer.port}", "tls": True,
                     "ca_file": str(self.pki.ca_cert), "token_env": "PEEP_SOAK_TOKEN"},
            "mqtt": {"enabled": False},
            "metrics": {"port": 0},
            "log": {"level": "warning", "format": "json"},
        }  # fmt: skip
        conf = self.out / f"{DESK}.toml"
        conf.write_text(to_toml(cfg))
        env = {**os.environ, **unit_environment(EDGE_UNIT), "PEEP_SOAK_TOKEN": self.tokens[DESK]}
        return EnrolmentDesk(conf, env, folders, count=3, interval_s=interval_s, clock=clock,
                             log=self.out / f"{DESK}.log")  # fmt: skip

    def operator(self, *, interval_s: float, clock: Callable[[], float], timeline: Any) -> Any:
        """A console operator (not started) on replica a's console, its account made by ``peep console add-user``."""
        from peep.lab.bench.soak.actors import ConsoleOperator, add_console_user

        env = {**os.environ, **unit_environment(SERVER_UNIT), "PEEP_MQTT_PASSWORD": self.server_password}
        otp = add_console_user(self.out / "replica-a.toml", "soak-operator", env)
        return ConsoleOperator(f"https://localhost:{self.console_ports['a']}", self.pki.ca_cert, "soak-operator", otp,
                               interval_s=interval_s, clock=clock, timeline=timeline)  # fmt: skip

    def people(self) -> dict[str, list[Path]]:
        from peep.edge.testing import lfw_people
        from peep.server.datasets import ensure_lfw

        return lfw_people(ensure_lfw(self.data_home).parent.parent)

    def ledger_epsilon(self) -> dict[str, float]:
        """Per device (the cameras, the desk), the Σ ε (per vector) of every release its own ledger records."""
        return {d: float(eps or 0.0) for d, (_n, eps) in self._ledger_sums().items()}

    def ledger_releases(self) -> dict[str, int]:
        """Per device (the cameras, the desk), how many releases its own ledger records."""
        return {d: int(n) for d, (n, _eps) in self._ledger_sums().items()}

    def _ledger_sums(self) -> dict[str, tuple[int, float | None]]:
        out = {}
        folders = {d: cam.state_dir for d, cam in self.cameras.items()} | {DESK: self.out / "devices" / DESK}
        for d, folder in folders.items():
            if not (folder / "ledger.sqlite3").exists():
                continue  # the desk before its first enrolment
            with sqlite3.connect(f"file:{folder / 'ledger.sqlite3'}?mode=ro", uri=True) as db:
                row = db.execute("SELECT COUNT(*), SUM(epsilon) FROM spends WHERE message_id != ''").fetchone()
            out[d] = (int(row[0]), row[1])
        return out

    def release_times(self) -> dict[str, list[float]]:
        """Per camera and the door, the wall-clock time of each release in its own ledger (a camera whose clock was
        stepped wrote that window's times on its stepped clock)."""
        out = {}
        folders = {d: cam.state_dir for d, cam in self.cameras.items()}
        if self.door is not None:
            folders[DOOR] = self.door.state_dir
        for d, folder in folders.items():
            try:
                with sqlite3.connect(f"file:{folder / 'ledger.sqlite3'}?mode=ro", uri=True) as db:
                    out[d] = [float(r[0]) for r in db.execute("SELECT time FROM spends WHERE message_id != ''")]
            except sqlite3.Error:
                out[d] = []
        return out

    def receipts(self) -> dict[tuple[str, str], float]:
        """``(camera, message id)`` to the time the server received it, from the ingest ledger (kept for the
        ledger's window, days: longer than any run)."""
        import psycopg

        assert self.pg is not None
        with psycopg.connect(self.pg.dsn, connect_timeout=5) as c:
            rows = c.execute("SELECT device_id, message_id, received_at FROM ingest_ledger WHERE device_id = ANY(%s)",
                             (list(self.cameras),)).fetchall()  # fmt: skip
        return {(str(d), str(m)): float(t) for d, m, t in rows}

    def kept_of_cameras(self, *, sweep_grace_s: float = 2 * RETENTION_INTERVAL_S + 10.0) -> dict[str, Any]:
        """Every table of the database read for the cameras' releases (passers-by, enrolled or not).

        A camera's release may be named in the ingest ledger (ids and times, swept after its window) and in a
        decision (swept after the retention window); anywhere else it is kept. Track memory within its
        stated expiry, or past it by less than ``sweep_grace_s`` (the sweep runs every few seconds), is listed
        apart: held as configured, not yet due.
        """
        import psycopg

        assert self.pg is not None
        released: set[str] = set()
        for cam in self.cameras.values():
            with sqlite3.connect(f"file:{cam.state_dir / 'ledger.sqlite3'}?mode=ro", uri=True) as db:
                released |= {r[0] for r in db.execute("SELECT message_id FROM spends WHERE message_id != ''")}
        where: dict[str, int] = {}
        now = time.time()
        held = 0
        with psycopg.connect(self.pg.dsn, connect_timeout=5) as c:
            tables = [r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")]
            for t in tables:
                cols = [r[0] for r in c.execute("SELECT column_name FROM information_schema.columns WHERE "
                                                "table_schema = current_schema() AND table_name = %s AND "
                                                "data_type = 'text'", (t,))]  # fmt: skip
                if not cols:
                    continue
                expiry = "expires_at" if t == "track_memory" else None
                sel = ", ".join(f'"{x}"' for x in cols) + (f', "{expiry}"' if expiry else "")
                for row in c.execute(f'SELECT {sel} FROM "{t}"'):  # the database's own table and column names
                    cells = row[: len(cols)]
                    if any(isinstance(x, str) and x in released for x in cells):
                        if expiry and float(row[-1]) > now - sweep_grace_s:
                            held += 1
                        else:
                            where[t] = where.get(t, 0) + 1
        allowed = {"ingest_ledger", "recognition_events"}
        kept = {t: n for t, n in where.items() if t not in allowed}
        return {"released": len(released), "found_in": dict(sorted(where.items())), "kept": sum(kept.values()),
                "kept_in": kept, "track_memory_within_expiry": held}  # fmt: skip

    # ------------------------------------------------------------------ following the events

    def _follow(self) -> None:
        """Follow the decision events through the balancer; after a break, call again from the last ``seq``."""
        from peep.v1 import recognition_pb2

        last = 0
        while not self._follow_stop.is_set():
            try:
                stream = self.stub().StreamEvents(recognition_pb2.StreamEventsRequest(after_seq=last),
                                                  metadata=self.admin_md)  # fmt: skip
                for ev in stream:
                    self.received.append((int(ev.seq), ev.event_id, ev.time.ToDatetime().timestamp(),
                                          ev.device_id, ev.message_id))  # fmt: skip
                    last = max(last, int(ev.seq))
                    if self._follow_stop.is_set():
                        stream.cancel()
                        return
            except Exception:  # the replica holding the stream went away: call again, as a subscriber does
                self._follow_stop.wait(0.5)

    # ------------------------------------------------------------------ faults

    def targets(self, kind: str) -> Sequence[str]:
        if kind.startswith("replica"):
            return [f"replica-{n}" for n in REPLICAS]
        if kind.startswith("postgres"):
            return ["postgres"]
        if kind == "broker_restart":
            return ["broker"]
        if kind in ("camera_kill", "network_cut"):
            return [*CAMERAS, DOOR]
        if kind == "disk_full":
            return list(self.disks)
        if kind == "clock_step":
            return list(self.clocks)
        return []

    def inject(self, fault: Fault) -> Callable[[], None]:
        assert self.pg is not None and self.broker is not None
        kind, target = fault.kind, fault.target
        if kind in ("replica_kill", "replica_term"):
            rep = self.replicas[target.removeprefix("replica-")]
            rep.stop(signal.SIGKILL if kind == "replica_kill" else signal.SIGTERM, timeout=30.0)

            def restart_replica() -> None:
                rep.start(timeout=120.0)

            return restart_replica
        if kind == "broker_restart":
            broker = self.broker
            broker.stop()

            def restart_broker() -> None:
                broker.start()

            return restart_broker
        if kind in ("postgres_fast", "postgres_immediate"):
            pg = self.pg
            pg.stop("fast" if kind == "postgres_fast" else "immediate")

            def restart_postgres() -> None:
                pg.start()

            return restart_postgres
        if kind == "camera_kill" and target == DOOR:
            self.door.kill()
            return self.door.start  # type: ignore[no-any-return]
        if kind == "network_cut" and target == DOOR:
            self.door.proxy.cut()
            return self.door.proxy.heal  # type: ignore[no-any-return]
        if kind == "disk_full":
            disk = self.disks[target]
            disk.fill()
            return disk.free  # type: ignore[no-any-return]
        if kind == "clock_step":
            clock = self.clocks[target]
            clock.step(CLOCK_STEP_S)
            return clock.reset  # type: ignore[no-any-return]
        if kind == "camera_kill":
            cam = self.cameras[target]
            if cam.proc is not None:
                cam.proc.send_signal(signal.SIGKILL)
                cam.proc.wait(10)
            return cam.start
        if kind == "network_cut":
            proxy = self.cameras[target].proxy
            proxy.cut()
            return proxy.heal
        raise ValueError(f"fault kind: expected one of {', '.join(KINDS)}, received {kind!r}")

    def decided_mark(self) -> int:
        """The id of the latest decision committed (0 before any): it grows with every decision.

        Not the number of decisions kept: retention deletes as decisions are made, so that number stands still,
        or falls when a sweep removes a burst decided after an earlier fault, while decisions go on (a camera's
        recovery once measured 22 s where its spool had drained in 7).
        """
        import psycopg

        assert self.pg is not None
        with psycopg.connect(self.pg.dsn, connect_timeout=3) as c:
            row = c.execute("SELECT COALESCE(MAX(id), 0) FROM recognition_events").fetchone()
            return int(row[0]) if row else 0

    def recovered(self, fault: Fault) -> bool:
        """Deciding again — a decision committed after the heal — and every camera alive with its spool drained."""
        now = self.decided_mark()
        baseline = self._baselines.setdefault(fault, now)  # the first ask after the heal sets the mark
        queued = [c.queued() for c in self.cameras.values()]
        drained = all(q is not None and q <= 2 for q in queued)  # a release or two in flight is not a backlog
        door_up = self.door is None or self.door.alive()
        return now > baseline and drained and door_up and all(c.alive() for c in self.cameras.values())

    # ------------------------------------------------------------------ the end

    def stop_cameras(self, drain_s: float = 30.0) -> None:
        """SIGTERM every camera (it drains its spool within its drain timeout), then wait for it to end."""
        for cam in self.cameras.values():
            if cam.alive():
                assert cam.proc is not None
                cam.proc.send_signal(signal.SIGTERM)
        for cam in self.cameras.values():
            if cam.proc is not None:
                try:
                    cam.proc.wait(drain_s)
                except subprocess.TimeoutExpired:
                    cam.proc.kill()
                    cam.proc.wait(10)

    def histories(self) -> tuple[list[DeviceHistory], list[tuple[str, str]], list[tuple[int, str]]]:
        """(what each camera says it released, the decisions committed, the events committed as (seq, id))."""
        import psycopg

        assert self.pg is not None
        devices = []
        for d, cam in self.cameras.items():
            with sqlite3.connect(f"file:{cam.state_dir / 'ledger.sqlite3'}?mode=ro", uri=True) as db:
                sent = {r[0] for r in db.execute("SELECT message_id FROM spends WHERE message_id != '' AND "
                                                 "key LIKE 'track:%'")}  # fmt: skip
            with sqlite3.connect(f"file:{cam.state_dir / 'spool.sqlite3'}?mode=ro", uri=True) as db:
                queued = {r[0] for r in db.execute("SELECT message_id FROM outbox")}
                dead = {r[0]: r[1] for r in db.execute("SELECT message_id, reason FROM dead")}
            # Over MQTT a template leaves the spool once the broker has it: the server's refusal is its note.
            if self.deadletters is not None:
                dead |= {m: f"server: {code}" for m, code in self.deadletters.of(d).items()}
            devices.append(DeviceHistory(d, frozenset(sent), dead, frozenset(queued)))
        with psycopg.connect(self.pg.dsn, connect_timeout=5) as c:
            decided = [(r[0], r[1]) for r in c.execute("SELECT device_id, message_id FROM recognition_events")]
            committed = [
                (int(r[0]), r[1]) for r in c.execute("SELECT id, event_id FROM recognition_events ORDER BY id")
            ]
        return devices, decided, committed

    def pids(self) -> dict[str, int | None]:
        out: dict[str, int | None] = {}
        for n, r in self.replicas.items():
            out[f"replica-{n}"] = r.proc.pid if r.proc is not None and r.proc.poll() is None else None
        for d, c in self.cameras.items():
            out[d] = c.proc.pid if c.alive() and c.proc is not None else None
        out[DOOR] = self.door.pid if self.door is not None else None
        out["broker"] = self.broker.pid if self.broker is not None else None
        out["postgres"] = self.pg.pid if self.pg is not None else None
        return out

    def close(self) -> None:
        """Stop everything, the door and cameras first; every wait bounded. The cameras' state folders are copied
        to ``devices-final/`` before their filesystems are unmounted."""
        self._follow_stop.set()
        if self.door is not None:
            self.door.close()
        if self.deadletters is not None:
            self.deadletters.stop()
        for cam in self.cameras.values():
            if cam.alive() and cam.proc is not None:
                cam.proc.kill()
            cam.proxy.close()
        if self.balancer is not None:
            self.balancer.stop()
        for n, r in self.replicas.items():
            r.stop(signal.SIGTERM, timeout=20.0)
            (self.out / f"replica-{n}.log").write_text("".join(r.lines))  # every life's log, in the run folder
        if self.broker is not None:
            self.broker.stop()
        if self.pg is not None:
            self.pg.stop("fast")
        for d, disk in self.disks.items():
            with contextlib.suppress(OSError):
                shutil.copytree(
                    disk.folder,
                    self.out / "devices-final" / d,
                    dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(disk.filler.name),
                )
            disk.close()
        for clock in self.clocks.values():
            clock.close()

    def describe(self) -> dict[str, Any]:
        return {"cameras": dict(CAMERAS), "replicas": [f"replica-{n}" for n in REPLICAS], "fps": self.fps,
                "enrolled": len(self.enrolled), "site": self.site, "door": DOOR, "desk": DESK,
                "state_disk_mb": STATE_DISK_MB, "clock_step_s": CLOCK_STEP_S,
                "unavailable_fault_kinds": dict(self.unavailable)}  # fmt: skip
