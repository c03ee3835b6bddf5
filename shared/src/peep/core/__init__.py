"""PEEP core: the maths every PEEP process shares.

Pure numpy maths (eigenfaces, mergeable statistics, bounding, local-DP
mechanisms, accounting), plus three modules with one outside library each:
:mod:`peep.core.imaging` (OpenCV, image geometry), :mod:`peep.core.wire`
(protobuf) and :mod:`peep.core.bundle` (onnx, onnxruntime, cryptography).
Never imports edge, server, paho, grpc or scikit-learn
(``tests/core/test_architecture.py`` enforces it).
"""

__version__ = "0.1.0"
