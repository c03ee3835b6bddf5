"""The edge's tracker on scenes, judged against the ground truth's passes.

A **pass** is one person crossing the scene once (a ground-truth track). Each frame, the detector's boxes
go to the edge's :class:`~peep.edge.tracking.Tracker`, and each box that matches a ground-truth face
(:func:`peep.lab.scenes.detectors.match_frame`) links that face's pass to the box's track; faces less
than half visible are left out, as they are of recall (a box there shows the face covering them). Then:

identity switches
    for each pass, the times the track its face is in changes from one matched frame to the next (CLEAR
    MOT's IDSW);
fragments
    for each pass, the tracks it was split into, less one;
mixed tracks
    tracks that held the faces of two different people. ``mixed_faces`` counts the faces in them that were
    not their main person's;
mixed released tracks
    tracks whose faces in a clear view (the tracker's ``clear_view``: what a device releases or decides on)
    held two people: what must never happen, since one track is one appearance's releases and one budget.
held faces
    faces the tracker held out of every track for a moment (:attr:`peep.edge.tracking.Track.held`: refused
    by the one track they could continue, nothing released). As CLEAR MOT counts a face no hypothesis covers,
    such a face is a miss of the tracker, not a switch: it neither continues nor breaks its pass.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

#: Share of a face box that must be visible for the face to count in recall.
MIN_VISIBLE = 0.5


class TrackJudge:
    """Counts switches, fragments and mixed tracks as frames go by, one scene at a time."""

    def __init__(self) -> None:
        self.per_scene: list[dict[str, Any]] = []
        self._scene: str | None = None

    def start(self, scene: str) -> None:
        self._close()
        self._scene = scene
        self._last: dict[int, str] = {}
        self._tracks_of_pass: dict[int, set[str]] = defaultdict(set)
        self._people: dict[str, Counter[str]] = defaultdict(Counter)
        self._released: dict[str, Counter[str]] = defaultdict(Counter)
        self._switches = 0
        self._held = 0

    def feed(
        self,
        faces: Sequence[dict[str, Any]],
        taken: Sequence[int | None],
        track_ids: Sequence[str],
        clear: Sequence[bool] | None = None,
        held: Sequence[bool] | None = None,
    ) -> None:
        """One frame: the ground truth's faces, the detection each matched (or None), each detection's track,
        whether the tracker gave it a clear view (what a device may release; all, when not given) and whether it
        held the detection out of every track (none, when not given)."""
        for face, i in zip(faces, taken, strict=True):
            # a face mostly hidden cannot be told from the one covering it, by a tracker or by this judge
            if i is None or float(face.get("visible", 1.0)) < MIN_VISIBLE:
                continue
            if held is not None and held[i]:
                self._held += 1
                continue
            tid = track_ids[i]
            p = int(face["track"])
            if p in self._last and self._last[p] != tid:
                self._switches += 1
            self._last[p] = tid
            self._tracks_of_pass[p].add(tid)
            self._people[tid][face["identity"]] += 1
            if clear is None or clear[i]:
                self._released[tid][face["identity"]] += 1

    def _close(self) -> None:
        if self._scene is None:
            return
        mixed = [c for c in self._people.values() if len(c) > 1]
        mixed_released = [c for c in self._released.values() if len(c) > 1]
        self.per_scene.append(
            {
                "scene": self._scene,
                "passes_seen": len(self._tracks_of_pass),
                "tracks": len(self._people),
                "identity_switches": self._switches,
                "fragments": sum(len(t) - 1 for t in self._tracks_of_pass.values()),
                "mixed_tracks": len(mixed),
                "mixed_faces": sum(sum(c.values()) - max(c.values()) for c in mixed),
                "mixed_released_tracks": len(mixed_released),
                "held_faces": self._held,
            }
        )
        self._scene = None

    def summary(self) -> dict[str, Any]:
        self._close()
        keys = (
            "passes_seen", "tracks", "identity_switches", "fragments", "mixed_tracks", "mixed_faces",
            "mixed_released_tracks", "held_faces",
        )  # fmt: skip
        total = {k: sum(s[k] for s in self.per_scene) for k in keys}
        n = total["passes_seen"]
        return {
            **total,
            "identity_switches_per_100_passes": 100.0 * total["identity_switches"] / n if n else None,
            "fragments_per_100_passes": 100.0 * total["fragments"] / n if n else None,
            "per_scene": list(self.per_scene),
        }
