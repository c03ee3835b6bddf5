"""The edge agents' configurations: every device of the run on its bundle, keys, server and budgets."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peep.core.bundle import ProjectionBundle, load_public_key
from peep.core.release import TemplateReleaser
from peep.lab.demo.steps.context import DESKS, DEVICE_TOKEN_ENV, DOOR, RunContext
from peep.server.descriptors import descriptor_backend


@dataclass(frozen=True)
class EdgeConfigs:
    """Makes the :class:`~peep.edge.config.EdgeConfig` of each device of the run.

    Attributes
    ----------
    ctx : RunContext
        The run (options, site, output folder).
    bundle_dir, public_key : Path
        The signed bundle and the deployer's public key that verifies it.
    site_key : Path or None
        The run's template key (None: the run is unkeyed).
    server_port : int
        The server's gRPC port on loopback.
    ca_file : Path
        The run's CA certificate, which the server's certificate chains to.
    """

    ctx: RunContext
    bundle_dir: Path
    public_key: Path
    site_key: Path | None
    server_port: int
    ca_file: Path

    @property
    def scene_detector(self) -> dict[str, Any]:
        """The cameras' ``[detector]`` on scenes (``--scenes``): YuNet where its file is, else HOG."""
        from peep.lab.demo.steps.scenes import detector_settings

        return detector_settings(self.ctx.opts.data_home)

    @property
    def min_face_score(self) -> float | None:
        """The cameras' ``recognition.min_face_score`` (:func:`peep.lab.demo.steps.scenes.camera_min_face_score`)."""
        from peep.lab.demo.steps.scenes import camera_min_face_score

        return camera_min_face_score(self.ctx.opts, self.scene_detector.get("kind") if self.ctx.opts.scenes else None)

    def __call__(self, device_id: str, transport: str, source: str, *, soft: bool) -> Any:
        """The configuration of ``device_id`` releasing over ``transport`` (``grpc`` or ``mqtt``) from ``source``."""
        from peep.edge.config import EdgeConfig

        o = self.ctx.opts
        desk = device_id in DESKS or device_id == DOOR  # enrolment desks release templates; the door has its own
        bundle = ProjectionBundle.load(self.bundle_dir, load_public_key(self.public_key))
        releaser = TemplateReleaser(bundle, kind=o.mechanism, epsilon=o.epsilon, delta=o.delta)
        cost = releaser.mechanism.guarantee.epsilon_vector + (2.0 if soft else 0.0)
        return EdgeConfig.model_validate(
            {
                "device": {
                    "id": device_id,
                    "site": self.ctx.site,
                    "state_dir": str(self.ctx.out / "devices" / device_id),
                },
                "bundle": {"path": str(self.bundle_dir), "public_key": str(self.public_key), "accept_updates": False},
                "privacy": {
                    "mechanism": o.mechanism,
                    "epsilon": o.epsilon,
                    "delta": o.delta or 0.0,
                    **({"site_key": str(self.site_key)} if self.site_key else {}),
                    # One person walking past: at most 2 releases' worth of ε per track.
                    "track_budget": 2.0 * cost,
                    "releases_per_window": 1,
                    "window_seconds": 60.0,
                    "min_track_frames": 3,
                },
                "soft": {"enabled": soft, "age_epsilon": 1.0, "gender_epsilon": 1.0},
                "capture": {"source": source, "max_fps": 0.0, "reconnect_attempts": 1},
                **({"detector": self.scene_detector} if o.scenes and not desk else {}),
                # The devices' descriptor network on the lab's back end (PEEP_DESCRIPTOR_BACKEND, onnxruntime
                # by default), so a run with dlib's own compares the two end to end.
                "descriptor": {"backend": descriptor_backend()},
                "spool": {"synchronous": "normal", "drain_timeout_s": 30.0},
                "mqtt": {"enabled": transport == "mqtt", "host": "127.0.0.1", "port": 1883, "tls": False},
                "grpc": {
                    "enabled": transport == "grpc",
                    "target": f"localhost:{self.server_port}",
                    "tls": True,
                    "ca_file": str(self.ca_file),
                    "token_env": DEVICE_TOKEN_ENV,
                },
                "metrics": {"port": 0},
                "log": {"level": "warning", "format": "text"},
                **(
                    {
                        "recognition": {
                            "decide": "device",
                            "epsilon_label": o.epsilon_label,
                            "fuse_frames": o.fuse_frames,
                            "choose_from": o.choose_from,
                            "min_face_score": self.min_face_score,
                        }
                    }
                    if o.decide == "device" and not desk
                    else {}
                ),
            }
        )
