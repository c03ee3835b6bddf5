"""``peep demo``: the whole system on one machine, with real parts.

1. a deployer key pair and a signed bundle whose projection is fitted on public background faces;
2. a recognition server in this process (gRPC over TLS on loopback, SQLite in
   the output folder; MQTT too when a broker answers on 127.0.0.1:1883), with
   the QBBS soft-biometric module;
3. two enrolment desks (edge agents in enrol mode, each in its own process)
   that enrol each subject from a folder of their photos; a public background
   population enrolled by the administrator to teach the recogniser "unknown";
4. training through the API;
5. several edge agents (a process each, as on their own hardware) watching
   videos composed from held-out photos of the subjects and of never-enrolled
   people, releasing perturbed templates over gRPC and MQTT under their
   release policy; the server identifies each one;
6. verification of genuine and impostor claims, face alone and fused with
   soft traits (the cameras' on-device LDP age/gender + synthetic height and
   weight, labelled so);
7. a summary (printed, ``summary.json``) and a self-contained ``report.html``.

Noise always comes from the secure sampler: this is a real deployment in
miniature, not a simulation.
"""

from __future__ import annotations

import json
import logging
import resource
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from peep.core.bundle import EigenfaceBundle, load_private_key, write_keypair
from peep.core.release import TemplateReleaser
from peep.server.demo.logfile import LOG_FILE, count_log, route_logs
from peep.server.demo.options import DemoOptions
from peep.server.demo.scenario import (
    Scenario,
    choose_people,
)
from peep.server.demo.steps.cameras import compose_videos, run_cameras
from peep.server.demo.steps.context import (
    ADMIN_TOKEN_ENV,  # noqa: F401  (importable from here, as before the steps)
    HEARTBEAT_S,
    RunContext,
    broker_reachable,
)
from peep.server.demo.steps.door import door_claims
from peep.server.demo.steps.edge import EdgeConfigs
from peep.server.demo.steps.enrolment import enrol_at_desks, enrol_background
from peep.server.demo.steps.enrolment import train as train_model
from peep.server.demo.steps.server import (
    DemoServer,
    IdentificationEvents,
    add_user_command,  # noqa: F401  (peep demo --console and its test import it from here)
    clear_broker,
    open_console,
    start_server,
)
from peep.server.demo.steps.soft_traits import TraitRange, enrol_soft_traits
from peep.server.demo.summary import (
    _stranger_keys,
    epsilon_per_appearance,
    identification_per_camera,
)
from peep.server.demo.verification import verify_claims
from peep.server.errors import UsageError
from peep.server.progress import Progress

log = logging.getLogger(__name__)

# What a run leaves in --out that the next run must not build on (removed when it starts), and the file that
# marks a folder as the demo's own.
_RUN_STATE = ("server", "devices", "enrol", "videos", "summary.json", "releases.json", "verification.json",
              "door.json", "report.html", LOG_FILE)  # fmt: skip
_OUT_MARKER = ".peep-demo"


def _cpu_s() -> float:
    """CPU seconds (user + system) of this process and of its worker processes that have ended."""
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


@dataclass
class StepTimer:
    """Wall and CPU seconds per step: on a busy or small machine, CPU is what a step costs."""

    steps: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    def run(self, name: str, fn: Callable[[], Any], say: Callable[[str], None]) -> Any:
        say(f"[{len(self.steps) + 1}] {name} ...")
        t0, c0 = time.perf_counter(), _cpu_s()
        out = fn()
        self.steps[name] = round(time.perf_counter() - t0, 2)
        self.cpu[name] = round(_cpu_s() - c0, 2)
        return out


class Demo:
    """One demo run; :meth:`run` returns the summary dict."""

    def __init__(self, opts: DemoOptions, *, say: Callable[[str], None] = print) -> None:
        self.opts = opts
        self.say = say
        self.out = Path(opts.out)
        self.log_path = self.out / LOG_FILE
        self.timer = StepTimer()
        self.ctx = RunContext.new(opts, say)
        self.releases: dict[str, dict[str, Any]] = {}  # message_id -> ground truth + payload
        self.lfw_names: list[str] = []  # every LFW person (folder names), listed when choosing people
        self.public_faces_used = (0, 0)  # the bundle's public faces: images, people
        self.trait_range = TraitRange()
        self.traits: dict[str, dict[str, float]] = {}  # the subjects' enrolled soft traits
        self._events = IdentificationEvents()
        #: The running server (None before it started and once closed).
        self.server: DemoServer | None = None
        self.edge: EdgeConfigs | None = None
        #: The console admin's one-time password (``--console``), printed once and never stored in clear.
        self.console_password: str | None = None
        #: The server's configuration as a dict (``server.toml``'s sections), once it started.
        self.server_config: dict[str, Any] = {}
        #: The bundle this run announced on the broker: its retained messages are cleared at close().
        self._broker_bundle: EigenfaceBundle | None = None

    @property
    def site(self) -> str:
        """The run's site name."""
        return self.ctx.site

    @property
    def admin_token(self) -> str:
        """The administrator's bearer token."""
        return self.ctx.admin_token

    @property
    def device_tokens(self) -> dict[str, str]:
        """Each device's bearer token, by device id."""
        return self.ctx.device_tokens

    @property
    def use_mqtt(self) -> bool:
        """Whether the run uses the broker on 127.0.0.1:1883 (decided when it starts)."""
        return self.ctx.use_mqtt

    @property
    def clipped_traits(self) -> dict[str, int]:
        """How many synthetic trait values were clipped to their declared range, by trait."""
        return self.trait_range.clipped

    def _in_range(self, trait: str, value: float) -> float:
        """``value`` clipped to the trait's declared range (counted in :attr:`clipped_traits`)."""
        return self.trait_range(trait, value)

    @property
    def events(self) -> dict[str, Any]:
        """The server's identification events, by message id."""
        return self._events.by_message

    @property
    def app(self) -> Any:
        """The running server application (None before it started and once closed)."""
        return self.server.app if self.server is not None else None

    # ------------------------------------------------------------------ steps

    def run(self) -> dict[str, Any]:
        o = self.opts
        self._fresh_out()
        # The server's and the devices' structured events (with their fields), warnings and up, in the run's
        # log: the terminal keeps the progress lines and the summary (errors reach it too).
        route_logs(self.log_path)
        self.ctx = replace(self.ctx, use_mqtt=o.mqtt == "on" or (o.mqtt == "auto" and broker_reachable()))
        if o.mqtt == "on" and not broker_reachable():
            raise RuntimeError("--mqtt on: no MQTT broker answers on 127.0.0.1:1883")
        t_start = time.perf_counter()
        say, step = self.say, self.timer.run
        scenario = step("choosing people from LFW", self._scenario, say)
        bundle = step("keys and a signed bundle from public background faces", lambda: self._bundle(scenario), say)
        step("starting the server (gRPC/TLS on loopback, SQLite, QBBS" + (", MQTT" if self.use_mqtt else "") + ")",
             lambda: self._start_server(bundle), say)  # fmt: skip
        try:
            server, edge = self.server, self.edge
            assert server is not None and edge is not None
            step("enrolling subjects at two enrolment desks (edge agents, enrol mode)",
                 lambda: enrol_at_desks(self.ctx, edge, scenario), say)  # fmt: skip
            step("enrolling a public background population (admin, teaches 'unknown')",
                 lambda: enrol_background(self.ctx, server, bundle, self.background_faces, self.site_key),
                 say)  # fmt: skip
            train = step("training on perturbed templates", lambda: train_model(self.ctx, server), say)
            self.traits = step("enrolling soft traits (QBBS)",
                               lambda: enrol_soft_traits(self.ctx, server, scenario, self.trait_range),
                               say)  # fmt: skip
            videos = step("composing camera videos", lambda: compose_videos(self.ctx, scenario), say)
            self.scripts = scripts = videos.cameras
            cameras = step(f"running {len(scripts)} edge agents over their videos",
                           lambda: run_cameras(self.ctx, edge, self._events, scripts), say)  # fmt: skip
            self.releases, cam = cameras.releases, cameras.edge
            verify = step(
                "verifying claims: face alone and fused with soft traits"
                + (" (skipped: no camera template reaches the server)" if o.decide == "device" else ""),
                lambda: verify_claims(self.ctx, server, scenario, self.releases, self.traits, self.trait_range),
                say,
            )
            door = None
            if o.door:
                how = "the device's own model" if o.decide == "device" else "the server's Verify"
                assert videos.door is not None
                door_script = videos.door
                door = step(f"a door: badge claims, the best face, {how}, a mock GPIO lock",
                            lambda: door_claims(self.ctx, edge, door_script), say)  # fmt: skip
            summary = self._summary(scenario, bundle, train, cam, verify, time.perf_counter() - t_start)
            if door is not None:
                summary["door"] = door
            if o.console:
                summary["console"] = step("opening the operator console", self._open_console, say)
        finally:
            if self.use_mqtt:
                self._broker_bundle = bundle
            if not (o.console and self.console_password):  # the console keeps the server until close()
                self.close()
        summary["log"] = count_log(self.log_path)
        (self.out / "summary.json").write_text(json.dumps(summary, indent=2, default=float) + "\n")
        # The ground truth of what the cameras released (who was in front of which camera when; never a
        # template): what the summary's figures and kept_templates.strangers are counted against.
        truth = [{k: v for k, v in r.items() if k != "payload"} | {"message_id": m} for m, r in self.releases.items()]
        (self.out / "releases.json").write_text(json.dumps(truth, indent=1) + "\n")
        from peep.server.demo.report import write_report

        write_report(summary, self.releases, self.events, self.out)
        return summary

    def _fresh_out(self) -> None:
        """Start from nothing in ``--out``: an earlier run's database, device ledgers and spools are removed.

        A second run into the same folder used to enrol on top of the first (twice the templates, the
        devices' ε added up). Only a folder the demo marked as its own is cleared, and only what the demo
        writes there; the caches (age/gender estimates) and the bundle's signing key pair stay.
        """
        marker = self.out / _OUT_MARKER
        made = [self.out / d for d in _RUN_STATE]
        if self.out.exists() and not marker.exists() and any(p.exists() for p in made):
            raise UsageError(
                f"--out {self.out}: holds {', '.join(p.name for p in made if p.exists())} but is not a folder an "
                "earlier peep demo made; choose a new or empty folder"
            )
        for p in made:
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()
        self.out.mkdir(parents=True, exist_ok=True)
        marker.write_text("a peep demo output folder: each run replaces its server, devices and enrolments\n")

    def _open_console(self) -> dict[str, Any]:
        """An admin account with a one-time password on the demo's server; the console stays up until close()."""
        assert self.server is not None
        console, self.console_password = open_console(self.server, self.out)
        return console

    def close(self) -> None:
        """Stop the demo's server (and its console), then clear what the run left retained on the broker; idempotent.

        The broker is cleared only here, after the console: clearing the devices' retained statuses while it
        is shown would take them off its Devices page.
        """
        if self.server is not None:
            self.server.stop()
            self.server = None
        bundle, self._broker_bundle = self._broker_bundle, None
        if bundle is not None:
            clear_broker(self.site, bundle)

    def _scenario(self) -> Scenario:
        import cv2
        from peep.core.imaging import primary_face
        from peep.edge.config import DetectorConfig
        from peep.edge.detection import build_detector
        from peep.edge.testing import lfw_people
        from peep.server.datasets import ensure_lfw

        o = self.opts
        people = lfw_people(ensure_lfw(o.data_home).parent.parent)
        self.lfw_names = list(people)
        self.lfw_counts = {n: len(p) for n, p in people.items()}
        # The same detector settings the demo's edge agents run with.
        detector = build_detector(DetectorConfig())

        def usable(path: Path) -> bool:
            # The enrolment desk needs a face in every photo it is given; read the
            # photo as its folder source does (colour, then the detector's gray).
            img = cv2.imread(str(path), cv2.IMREAD_COLOR)
            return img is not None and primary_face(detector.detect(img), img.shape) is not None

        return choose_people(
            people,
            n_subjects=o.subjects,
            enrol_images=o.enrol_images,
            probe_images=o.probe_images,
            n_strangers=o.strangers,
            seed=o.seed,
            usable=usable,
        )

    def _bundle(self, scenario: Scenario) -> EigenfaceBundle:
        from peep.server.bundles.build import build_bundle
        from peep.server.datasets import load_dataset

        keys = self.out / "keys"
        if not (keys / "site.key").exists():
            write_keypair(keys / "site")
        self.key_path, self.pub_path = keys / "site.key", keys / "site.pub"
        self._make_site_key(keys)
        from peep.core.projections import projection_class

        input_kind = projection_class(self.opts.projection).input_kind
        encoder: Any = None
        if input_kind != "pixels":
            from peep.server.descriptors import descriptor_encoder

            # The public faces' descriptors from the network the cameras run (cached by image content).
            encoder = descriptor_encoder(input_kind)
            self.say(f"    {input_kind} descriptors of the public faces (computed on every core once, then cached)")
        what = "    public faces: finding, cropping" + (f" and describing ({input_kind})" if encoder else "")

        def public_faces(max_faces: int | None, people: list[str]) -> Any:
            # Minutes on a first run: a line every few seconds even off a terminal, so it never looks stuck.
            # Only the people asked for are read: strangers' and enrolled people's photos are never described
            # here (the cameras and the enrolment desk see them).
            with Progress(what, heartbeat=HEARTBEAT_S) as bar:
                return load_dataset(
                    "lfw",
                    data_home=self.opts.data_home,
                    min_faces=5,
                    max_faces=max_faces,
                    encoder=encoder,
                    progress=bar.update,
                    people=people,
                )

        self.calibration_people: list[str] = []
        background_people = list(scenario.background)
        if self.opts.decide == "device":
            # The devices' thresholds are set on public people the model never saw: the background class keeps
            # the first background_people of the (seeded) background population, the rest and the LFW people
            # with 20+ photos who are not enrolled calibrate.
            order = np.random.default_rng(self.opts.seed + 5).permutation(len(background_people))
            shuffled = [background_people[i] for i in order]
            background_people = sorted(shuffled[: self.opts.background_people])
            enrolled = {n.replace(" ", "_") for n in scenario.enrolled}
            frequent = [n for n, c in self.lfw_counts.items() if c >= 20 and n.replace(" ", "_") not in enrolled]
            self.calibration_people = sorted(shuffled[self.opts.background_people :]) + sorted(frequent)
        background = public_faces(min(9, self.opts.public_max_faces or 9), background_people)
        self.background_faces = background
        # The bundle is fitted on public faces the demo never uses as a person: the background population
        # and, up to --public-max-faces images each, the LFW people who are neither enrolled nor strangers.
        taken = {n.replace(" ", "_") for n in (*scenario.enrolled, *scenario.strangers)}
        # Nor the calibration people: a projection fitted on their faces places them as it never places a stranger
        # (measured by the audit's open-set section: released FPIR over its target, more so at larger K).
        taken |= {n.replace(" ", "_") for n in self.calibration_people}
        public = public_faces(self.opts.public_max_faces, [n for n in self.lfw_names if n not in taken])
        self.bundle_dir = self.out / "bundle"
        bundle = build_bundle(
            public,
            n_components=self.opts.n_components,
            signing_key=load_private_key(self.key_path),
            out_dir=self.bundle_dir,
            mechanism_defaults={"kind": self.opts.mechanism, "epsilon": self.opts.epsilon},
            projection=self.opts.projection,
            mirror=self.opts.mirror,
            network=None if encoder is None else encoder.identity,
        )
        self.public_faces_used = (public.n_images, public.n_subjects)
        self.say(
            f"    bundle {bundle.bundle_id}: {bundle.projection_kind}, nc={bundle.n_components}, from "
            f"{public.n_images} faces of {public.n_subjects} public people (none enrolled, none a stranger)"
        )
        self.calibration_path: Path | None = None
        if self.opts.decide == "device":
            self.calibration_path = self._calibration(bundle)
        return bundle

    def _calibration(self, bundle: EigenfaceBundle) -> Path:
        """The public faces every device model carries (clean, unkeyed): what the devices set thresholds on."""
        from peep.server.bundles.calibrate import make_calibration, write_calibration

        with Progress("    calibration faces (public people the model never sees)", heartbeat=HEARTBEAT_S) as bar:
            projections, people, domain, kind = make_calibration(
                bundle, "lfw", mechanism=self.opts.mechanism, data_home=self.opts.data_home, min_faces=5,
                people=self.calibration_people, max_per_person=self.opts.calibration_max_faces, progress=bar.update,
            )  # fmt: skip
        path = self.out / "server" / "calibration.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        cal = write_calibration(path, projections=projections, people=people, bundle_id=bundle.bundle_id,
                                domain=domain, mechanism=kind)  # fmt: skip
        self.say(f"    calibration: {cal.n_faces} clean projections of {cal.n_people} public people, none in the "
                 "background class, none enrolled, none a stranger")  # fmt: skip
        return path

    def _make_site_key(self, keys: Path) -> None:
        """A new template key for this run, or none (``--no-site-key``, or a mechanism a rotation would clip)."""
        from peep.core.release import check_keyed_kind
        from peep.core.sitekey import SiteKey

        path = keys / "template.key"
        if path.exists():
            path.unlink()  # the previous run's: each run has its own
        self.site_key: SiteKey | None = None
        self.site_key_path: Path | None = None
        if not self.opts.site_key:
            return
        try:
            check_keyed_kind(self.opts.mechanism)
        except ValueError as exc:
            self.say(f"    no site key: {exc}")
            return
        self.site_key = SiteKey.generate()
        self.site_key_path = self.site_key.write(path)
        self.say(f"    site key {self.site_key.key_id} for the devices and the administrator ({path}; the server "
                 "never reads it)")  # fmt: skip

    def _start_server(self, bundle: EigenfaceBundle) -> None:
        self.server = start_server(self.ctx, self._events, public_key=self.pub_path, bundle_dir=self.bundle_dir,
                                   signing_key=self.key_path, calibration=self.calibration_path)  # fmt: skip
        self.server_config = self.server.config
        self.pki = self.server.pki
        self.recognition, self.qbbs, self.admin_md = self.server.recognition, self.server.qbbs, self.server.admin_md
        self.edge = EdgeConfigs(self.ctx, bundle_dir=self.bundle_dir, public_key=self.pub_path,
                                site_key=self.site_key_path, server_port=self.server.port,
                                ca_file=self.server.pki.ca_cert)  # fmt: skip

    def _kept(self) -> dict[str, Any]:
        """What the server's database keeps after the run, counted there (``recognition.keep``, default none).

        ``strangers`` counts the stored templates of the never-enrolled people the cameras released (their
        message ids are known here, not to the server): 0 unless ``keep = "all"``.
        """
        services = self.app.services
        counts = services.store.kept_counts(services.config.training.background_prefix)
        strangers = sum(
            services.store.get_template(mid, device_id=dev) is not None for dev, mid in _stranger_keys(self.releases)
        )
        return {
            "templates": {
                "enrolment": counts.enrolment,
                "background": counts.background,
                "recognised": counts.recognised,
                "strangers": strangers,
            },
            "keep": services.config.recognition.keep,
            "unknown_identify_verify_templates": counts.unknown,
            "decisions": counts.decisions,
            "unknown_decisions": counts.unknown_decisions,
            "ledger_entries": counts.ledger,
            "track_memory": counts.track_memory,
        }

    # ------------------------------------------------------------------ summary

    def _summary(
        self,
        scenario: Scenario,
        bundle: EigenfaceBundle,
        train: dict[str, Any],
        cam: dict[str, Any],
        verify: dict[str, Any],
        wall_s: float,
    ) -> dict[str, Any]:
        enrolled_hits = enrolled_n = enrolled_unknown = 0
        strangers_unknown = strangers_n = 0
        fused = 0
        for mid, r in self.releases.items():
            ev = self.events.get(mid)
            if ev is None or r["person"] is None:
                continue
            fused += int(ev.releases_fused > 1)
            if r["enrolled"]:
                enrolled_n += 1
                enrolled_hits += int((not ev.unknown) and ev.subject == r["person"])
                enrolled_unknown += int(ev.unknown)
            else:
                strangers_n += 1
                strangers_unknown += int(ev.unknown)
        o = self.opts
        mech = TemplateReleaser(bundle, kind=o.mechanism, epsilon=o.epsilon, delta=o.delta).mechanism
        g = mech.guarantee
        appearances = sum(len(s.appearances) for s in self.scripts)
        kept = self._kept()
        per_appearance = epsilon_per_appearance(self.releases, [s.device_id for s in self.scripts], self.out)
        per_camera = identification_per_camera(self.releases, self.events)
        return {
            "data": {
                "subjects": len(scenario.enrolled),
                "enrolment_images": sum(len(v) for v in scenario.enrolled.values()),
                "probe_appearances": sum(1 for s in self.scripts for a in s.appearances if a.enrolled),
                "stranger_appearances": sum(1 for s in self.scripts for a in s.appearances if not a.enrolled),
                "background_people": len(scenario.background),
                "soft_traits": "age and gender: estimated from photos (enrolment) and released on-device with LDP "
                "(observation); height and weight: SYNTHETIC (NHANES-based draws), labelled as such",
            },
            "bundle": {
                "bundle_id": bundle.bundle_id,
                "projection": bundle.projection_kind,
                "n_components": bundle.n_components,
                # What it was fitted on (the demo's public faces: never an enrolled person or a stranger).
                "public_faces": self.public_faces_used[0],
                "public_people": self.public_faces_used[1],
            },
            "privacy": {
                "mechanism": o.mechanism,
                "epsilon_parameter": o.epsilon,
                "epsilon_coordinate": g.epsilon_coordinate,
                "epsilon_vector": g.epsilon_vector,
                "delta": g.delta,
                "sampler": "secure (OS CSPRNG, discrete Laplace/Gaussian on a 2^-20-scale grid)",
                "soft_traits_epsilon_per_release": 2.0 if o.soft else 0.0,
                "per_track_budget_epsilon_vector": 2.0 * (g.epsilon_vector + (2.0 if o.soft else 0.0)),
                "note": "per-vector ε above a few units is not a meaningful guarantee; see docs/AUDIT.md",
                # Every template rotated by this run's site key before the noise (same ε and δ); "" = unkeyed.
                "site_key_id": self.site_key.key_id if self.site_key else "",
            },
            "model": train,
            "identification": {
                "accuracy": enrolled_hits / enrolled_n if enrolled_n else None,
                "enrolled_templates": enrolled_n,
                "enrolled_called_unknown": enrolled_unknown / enrolled_n if enrolled_n else None,
                "unknown_rejection_rate": strangers_unknown / strangers_n if strangers_n else None,
                "stranger_templates": strangers_n,
                "appearances": appearances,
                # Decisions fused with the same track's previous release (training.track_fusion_s).
                "fused_decisions": fused,
                # Judged as NIST's FRVT judges 1:N: enrolled captures not named as themselves, strangers named.
                "decided_on": o.decide,
                "fnir": 1.0 - enrolled_hits / enrolled_n if enrolled_n else None,
                "fpir": 1.0 - strangers_unknown / strangers_n if strangers_n else None,
                "epsilon_per_appearance": per_appearance,
                "per_camera": per_camera,
                **({"epsilon_label": o.epsilon_label} if o.decide == "device" else {}),
            },
            "verification": {k: v for k, v in verify.items() if k != "rows"},
            "kept_templates": kept["templates"],
            "kept": kept,
            "edge": cam,
            "mqtt": self.use_mqtt,
            "site": self.site,
            "steps_s": self.timer.steps,
            "steps_cpu_s": self.timer.cpu,
            "wall_s": round(wall_s, 1),
        }


def run_demo(opts: DemoOptions, *, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the demo; returns the summary (also written to ``OUT/summary.json``)."""
    return Demo(opts, say=say).run()


__all__ = ["Demo", "DemoOptions", "run_demo"]
