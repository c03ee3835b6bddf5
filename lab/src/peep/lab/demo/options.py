"""What ``peep demo`` runs: its options, each with why it has the value it has."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class DemoOptions:
    """What ``peep demo`` runs (CLI options map one to one)."""

    out: Path
    data_home: str | None = None
    subjects: int = 10
    enrol_images: int = 20
    probe_images: int = 6
    # 60 never-enrolled people: one stranger is 1.7 points of rejection (30 made it 3.3, and runs of
    # the same seed varied by ±5 points from the secure noise alone).
    strangers: int = 60
    cameras: int = 3
    # The audit's frontier at a per-template ε of 16 or less (docs/AUDIT.md): privunit on dlib's
    # ResNet descriptor reduced to K = 16 by a whitened PCA of the public background's
    # descriptors, shrinkage LDA (Fisherfaces K = 24 at ε = 32 was the default before).
    mechanism: str = "privunit"
    epsilon: float = 16.0
    delta: float | None = None
    projection: str = "dlib-resnet"
    # None: 16 when the server decides (a larger K only adds noise to one release), 48 when the devices decide
    # (they score the clean projection, where a larger K separates people better; docs/OPEN_SET.md). Seeds 0-2
    # pooled, deciding on the device: K 32 identified 94.2 % of 173 enrolled captures and its door opened for
    # 91.1 % of 180 genuine claims; K 48 97.1 % and 95.0 %; K 64 95.4 % and 93.9 % (0-2 of 180 strangers named
    # and 0 of 180 impostors let in at each; docs/DEMO.md).
    components: int | None = None
    mirror: bool | None = None
    preset: str = "lda"
    # Strangers named at most 10 % of the time on the public background: over seeds 0-11 at ε = 16,
    # 90.3 % rejected for 88.5 % of enrolled captures identified (0.2 gave 72 % / 95 %; docs/DEMO.md).
    identify_far: float = 0.1
    # Verification calibrated for 1 % FAR on held-out enrolment templates; measured on the captures with
    # every capture claimed as every other subject (~530 impostor claims): 0.0-1.1 %, mean 0.4 % (seeds 0-11).
    verify_far: float = 0.01
    # The bundle's public faces: LFW people with 5 to this many images who are neither enrolled nor strangers
    # (None: every such person). 9 fits it on the background population's people alone: 1,279 faces instead
    # of 3,851, 2.5 fewer minutes on a first run, and over seeds 0-5 identification 93.3 % of 356 captures
    # (86.2 % with all), rejection 90.2 % of 358 (89.9 %), FAR 0.5 % of 3,204 claims (0.3 %); docs/DEMO.md.
    public_max_faces: int | None = 9
    soft: bool = True
    qbbs_epsilon: float = 1.0
    mqtt: str = "auto"  # auto | on | off
    seed: int = 0
    fps: float = 15.0
    # The cameras watch rendered scenes (peep.lab.scenes): their people walking through a room, an
    # entrance or a street, several at once, faces 30-160 px, judged per pass against the scene's ground
    # truth; off: composed videos, one portrait at a time crossing a grey frame.
    scenes: bool = False
    visible_frames: int = 20
    # Longer than the tracker's max_age_s (1 s at 15 fps): the next person starts a new track.
    gap_frames: int = 20
    background_templates: int = 1500
    # Leave the server and its operator console running on the demo's data (peep demo --console).
    console: bool = False
    # The server's recognition.keep: identify/verify templates are decided, then forgotten by default.
    keep: str = "none"
    # A fresh site key for the run (<out>/keys/template.key): the devices and the administrator's background
    # enrolment rotate every template by it; the server sees key ids only. Not for mechanisms a rotation
    # would clip (the demo then runs unkeyed and says so).
    site_key: bool = True
    # A door (peep.edge.door): every held-out photo shown at it twice, with the person's own badge and with
    # another subject's, through the real door path; the lock a mock GPIO pin.
    door: bool = True
    door_visible_frames: int = 10
    door_gap_frames: int = 1
    # Where cameras and the door decide (docs/DECISIONS.md): "device" runs the server's signed model on each
    # device's clean projection and releases only a label (k-RR at epsilon_label); "server" releases templates.
    decide: str = "device"
    epsilon_label: float = 8.0
    # A camera deciding on the device averages this many frames' clean projections of a track before its
    # decision (no ε: nothing leaves; the track's first decision waits for them).
    fuse_frames: int = 3
    # Frames of a track looked at before that decision, the fuse_frames with the largest faces fused
    # (None: fuse_frames, the track's first).
    choose_from: int | None = None
    # Cameras fuse and decide only on faces the detector scored at least this (None: every face).
    min_face_score: float | None = None
    # On scenes: this share of each subject's enrolment photos is drawn as the scenes' camera sees a face
    # (peep.lab.scenes.views) before the desk releases it, as if enrolled at the camera that will see them;
    # the same photos and releases, so the same ε per subject. 0: every photo as it is.
    enrol_as_seen: float = 0.0
    # Public people whose clean projections set the devices' thresholds: LFW's one-image people (lfw_singles,
    # beside the LFW copy), calibration_people of them chosen by the seed. A threshold that lets a share t of
    # n public people through lets about (floor(t n) + 1) / (n + 1) of new people through: 1,000 resolve the
    # cameras' 1 % target to 1.1 % at worst (the label mechanism leaves the model ~0.7 %, i.e. 7 of them), and
    # the door's 0.1 % FAR is set on 1,000 x enrolled impostor scores. Describing them costs ~25 s of CPU on
    # a first run, then nothing (cached); all 4,069 would cost 4 times that for 0.1 point.
    calibration_people: int = 1000
    # Deciding on the device: the share of the calibration people a camera's identification may name (the
    # server's training.device_models.fpir, whose default it is).
    device_fpir: float = 0.01
    # Without the singles: LFW people with 20+ images who are not enrolled (all their photos, up to this many
    # each; every person weighs the same on the device) and the 5-9-image people beyond the first
    # background_people of the background population (26-155 people: the thresholds then name more strangers
    # than their target, and the demo says so).
    calibration_max_faces: int = 20
    background_people: int = 140

    @property
    def n_components(self) -> int:
        """The bundle's K: as given, else the default for where decisions are made."""
        if self.components is not None:
            return self.components
        return 48 if self.decide == "device" else 16
