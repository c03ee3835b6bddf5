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

Each step is a unit of :mod:`peep.lab.demo.steps`, called with the run's
:class:`~peep.lab.demo.steps.context.RunContext` and the earlier steps' outputs;
:meth:`Demo.run` is the list of them.

Noise always comes from the secure sampler: this is a real deployment in
miniature, not a simulation.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from peep.core.bundle import ProjectionBundle
from peep.lab.demo.logfile import LOG_FILE, count_log, route_logs
from peep.lab.demo.options import DemoOptions
from peep.lab.demo.steps.bundle import FittedBundle, Keys, keys_and_bundle
from peep.lab.demo.steps.cameras import compose_videos, run_cameras
from peep.lab.demo.steps.context import (
    ADMIN_TOKEN_ENV,
    DEVICE_TOKEN_ENV,
    RunContext,
    broker_reachable,
)
from peep.lab.demo.steps.door import door_claims
from peep.lab.demo.steps.edge import EdgeConfigs
from peep.lab.demo.steps.enrolment import enrol_at_desks, enrol_background, train
from peep.lab.demo.steps.output import fresh_out, write_results
from peep.lab.demo.steps.people import choose_from_lfw
from peep.lab.demo.steps.results import kept_in_store, summarise
from peep.lab.demo.steps.server import (
    DemoServer,
    IdentificationEvents,
    add_user_command,
    clear_broker,
    open_console,
    start_server,
)
from peep.lab.demo.steps.soft_traits import TraitRange, enrol_soft_traits
from peep.lab.demo.steps.verification import verify_claims


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
    """One demo run; :meth:`run` returns the summary dict.

    The run's server outlives :meth:`run` with ``--console`` (until :meth:`close`); the attributes below
    are what a caller reads of a run.

    Attributes
    ----------
    ctx : RunContext
        What every step shares: options, output folder, site, tokens, whether MQTT is used.
    releases : dict of message id -> release
        What the cameras released, with who was in front of the camera (and the payload).
    server : DemoServer or None
        The running server (None before it started and once closed).
    console_password : str or None
        The console admin's one-time password (``--console``), printed once and never stored in clear.
    server_config : dict
        The server's configuration as a dict (``server.toml``'s sections), once it started.
    """

    def __init__(self, opts: DemoOptions, *, say: Callable[[str], None] = print) -> None:
        self.opts = opts
        self.say = say
        self.out = Path(opts.out)
        self.log_path = self.out / LOG_FILE
        self.timer = StepTimer()
        self.ctx = RunContext.new(opts, say)
        self.releases: dict[str, dict[str, Any]] = {}
        self.trait_range = TraitRange()
        self._events = IdentificationEvents()
        self.server: DemoServer | None = None
        self.console_password: str | None = None
        self.server_config: dict[str, Any] = {}
        # The bundle this run announced on the broker: its retained messages are cleared at close().
        self._broker_bundle: ProjectionBundle | None = None

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
    def events(self) -> dict[str, Any]:
        """The server's identification events, by message id."""
        return self._events.by_message

    @property
    def app(self) -> Any:
        """The running server application (None before it started and once closed)."""
        return self.server.app if self.server is not None else None

    @property
    def clipped_traits(self) -> dict[str, int]:
        """How many synthetic trait values were clipped to their declared range, by trait."""
        return self.trait_range.clipped

    def _in_range(self, trait: str, value: float) -> float:
        """``value`` clipped to the trait's declared range (counted in :attr:`clipped_traits`)."""
        return self.trait_range(trait, value)

    def run(self) -> dict[str, Any]:
        """Run every step; returns the summary (also written to ``<out>/summary.json``, with the report)."""
        o = self.opts
        fresh_out(self.out)
        # The server's and the devices' structured events (with their fields), warnings and up, in the run's
        # log: the terminal keeps the progress lines and the summary (errors reach it too).
        route_logs(self.log_path)
        ctx = self.ctx = replace(self.ctx, use_mqtt=o.mqtt == "on" or (o.mqtt == "auto" and broker_reachable()))
        if o.mqtt == "on" and not broker_reachable():
            raise RuntimeError("--mqtt on: no MQTT broker answers on 127.0.0.1:1883")
        t_start = time.perf_counter()
        say, step = self.say, self.timer.run
        people = step("choosing people from LFW", lambda: choose_from_lfw(o), say)
        scenario = people.scenario
        keys, fitted = step("keys and a signed bundle from public background faces",
                            lambda: keys_and_bundle(ctx, people), say)  # fmt: skip
        parts = "SQLite, QBBS" + (", MQTT" if ctx.use_mqtt else "")
        server = step(f"starting the server (gRPC/TLS on loopback, {parts})",
                      lambda: self._start_server(keys, fitted), say)  # fmt: skip
        try:
            edge = EdgeConfigs(ctx, bundle_dir=fitted.bundle_dir, public_key=keys.public_key,
                               site_key=keys.site_key_path, server_port=server.port,
                               ca_file=server.pki.ca_cert)  # fmt: skip
            step("enrolling subjects at two enrolment desks (edge agents, enrol mode)",
                 lambda: enrol_at_desks(ctx, edge, scenario), say)  # fmt: skip
            step("enrolling a public background population (admin, teaches 'unknown')",
                 lambda: enrol_background(ctx, server, fitted.bundle, fitted.background_faces, keys.site_key),
                 say)  # fmt: skip
            model = step("training on perturbed templates", lambda: train(ctx, server), say)
            traits = step("enrolling soft traits (QBBS)",
                          lambda: enrol_soft_traits(ctx, server, scenario, self.trait_range), say)  # fmt: skip
            videos = step("rendering the cameras' scenes" if o.scenes else "composing camera videos",
                          lambda: compose_videos(ctx, scenario), say)  # fmt: skip
            cameras = step(f"running {len(videos.cameras)} edge agents over their videos",
                           lambda: run_cameras(ctx, edge, self._events, videos.cameras), say)  # fmt: skip
            self.releases = cameras.releases
            judged = None
            if o.scenes:
                from peep.lab.demo.steps.scenes import detector_settings, scene_summary

                judged = step("judging each pass against its scene's ground truth, and the detector's recall",
                              lambda: scene_summary(ctx, videos.cameras, cameras.releases, self.events,
                                                    detector_settings(o.data_home)), say)  # fmt: skip
            verification = step(
                "verifying claims: face alone and fused with soft traits"
                + (" (skipped: no camera template reaches the server)" if o.decide == "device" else ""),
                lambda: verify_claims(ctx, server, scenario, cameras.releases, traits, self.trait_range),
                say,
            )
            door = None
            if videos.door is not None:  # --door
                how = "the device's own model" if o.decide == "device" else "the server's Verify"
                door_script = videos.door
                door = step(f"a door: badge claims, the best face, {how}, a mock GPIO lock",
                            lambda: door_claims(ctx, edge, door_script), say)  # fmt: skip
            summary = summarise(
                ctx, scenario=scenario, fitted=fitted, keys=keys, model=model, scripts=videos.cameras,
                releases=cameras.releases, events=self.events, edge=cameras.edge, verification=verification,
                kept=kept_in_store(server.app, cameras.releases), steps_s=self.timer.steps,
                steps_cpu_s=self.timer.cpu, wall_s=time.perf_counter() - t_start, scene_judgement=judged,
            )  # fmt: skip
            if door is not None:
                summary["door"] = door
            if o.console:
                summary["console"] = step("opening the operator console", self._open_console, say)
        finally:
            if ctx.use_mqtt:
                self._broker_bundle = fitted.bundle
            if not (o.console and self.console_password):  # the console keeps the server until close()
                self.close()
        summary["log"] = count_log(self.log_path)
        write_results(self.out, summary, self.releases, self.events)
        return summary

    def _start_server(self, keys: Keys, fitted: FittedBundle) -> DemoServer:
        self.server = start_server(self.ctx, self._events, public_key=keys.public_key, bundle_dir=fitted.bundle_dir,
                                   signing_key=keys.signing_key, calibration=fitted.calibration)  # fmt: skip
        self.server_config = self.server.config
        return self.server

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


def run_demo(opts: DemoOptions, *, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the demo; returns the summary (also written to ``OUT/summary.json``)."""
    return Demo(opts, say=say).run()


# add_user_command and the token variables' names: importable from here, as before the steps were apart
# (``peep demo --console`` prints the command).
__all__ = ["ADMIN_TOKEN_ENV", "DEVICE_TOKEN_ENV", "Demo", "DemoOptions", "add_user_command", "run_demo"]
