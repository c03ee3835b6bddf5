"""Recognition: fitting recognisers on perturbed templates, training jobs, the model registry, serving.

The face others use: :mod:`~peep.server.recognition.presets` and :mod:`~peep.server.recognition.fitting` (what
can be trained, and fitting it), :mod:`~peep.server.recognition.trainer` (training jobs),
:mod:`~peep.server.recognition.model_registry` (versions, atomic promotion), :mod:`~peep.server.recognition.watch`
(noticing a promotion elsewhere), :mod:`~peep.server.recognition.recogniser` (serving: identify, and every
claim decided), :mod:`~peep.server.recognition.tracks` and :mod:`~peep.server.recognition.fusion` (a track's
releases decided together), :mod:`~peep.server.recognition.thresholds` (thresholds set on held-out scores),
:mod:`~peep.server.recognition.claims` (a door's claim check) and :mod:`~peep.server.recognition.devicemodels`
(the models signed for devices that decide themselves). ``linear`` and ``export`` serve fitting only. Each
module's ``__all__`` names what it offers; anything else is the module's own
(``tests/server/test_public_faces.py``).
"""

__all__ = [
    "claims",
    "devicemodels",
    "fitting",
    "fusion",
    "model_registry",
    "presets",
    "recogniser",
    "thresholds",
    "tracks",
    "trainer",
    "watch",
]
