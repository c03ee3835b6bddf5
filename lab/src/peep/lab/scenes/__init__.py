"""Scenes with ground truth: what a camera sees, for measuring detectors, tracks and recognition.

:mod:`peep.lab.scenes.render` draws videos of people walking through a room, an entrance or a street
(1-4 at a time, faces 30-160 px, occlusion, turning, light changes, sensor noise, motion blur, H.264 at a
camera's bitrate), each person's head and shoulders taken from their own LFW photo with the photo's
surroundings, and writes every frame's faces (box, identity, role, track, visible share) beside the video.
:mod:`peep.lab.scenes.detectors` measures face detectors on them per face-height bin.
"""
