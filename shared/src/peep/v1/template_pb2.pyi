import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MechanismKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MECHANISM_KIND_UNSPECIFIED: _ClassVar[MechanismKind]
    MECHANISM_KIND_PEEP: _ClassVar[MechanismKind]
    MECHANISM_KIND_PEEP_RAW: _ClassVar[MechanismKind]
    MECHANISM_KIND_LAPLACE_VECTOR: _ClassVar[MechanismKind]
    MECHANISM_KIND_GAUSSIAN_L2: _ClassVar[MechanismKind]
    MECHANISM_KIND_LAPLACE_L1: _ClassVar[MechanismKind]
    MECHANISM_KIND_PRIVUNIT: _ClassVar[MechanismKind]
    MECHANISM_KIND_PRIVUNIT_G: _ClassVar[MechanismKind]

class Purpose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PURPOSE_UNSPECIFIED: _ClassVar[Purpose]
    PURPOSE_ENROLL: _ClassVar[Purpose]
    PURPOSE_IDENTIFY: _ClassVar[Purpose]
    PURPOSE_VERIFY: _ClassVar[Purpose]

class SoftTraitKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SOFT_TRAIT_KIND_UNSPECIFIED: _ClassVar[SoftTraitKind]
    SOFT_TRAIT_KIND_AGE: _ClassVar[SoftTraitKind]
    SOFT_TRAIT_KIND_GENDER: _ClassVar[SoftTraitKind]
    SOFT_TRAIT_KIND_HEIGHT: _ClassVar[SoftTraitKind]
    SOFT_TRAIT_KIND_WEIGHT: _ClassVar[SoftTraitKind]
MECHANISM_KIND_UNSPECIFIED: MechanismKind
MECHANISM_KIND_PEEP: MechanismKind
MECHANISM_KIND_PEEP_RAW: MechanismKind
MECHANISM_KIND_LAPLACE_VECTOR: MechanismKind
MECHANISM_KIND_GAUSSIAN_L2: MechanismKind
MECHANISM_KIND_LAPLACE_L1: MechanismKind
MECHANISM_KIND_PRIVUNIT: MechanismKind
MECHANISM_KIND_PRIVUNIT_G: MechanismKind
PURPOSE_UNSPECIFIED: Purpose
PURPOSE_ENROLL: Purpose
PURPOSE_IDENTIFY: Purpose
PURPOSE_VERIFY: Purpose
SOFT_TRAIT_KIND_UNSPECIFIED: SoftTraitKind
SOFT_TRAIT_KIND_AGE: SoftTraitKind
SOFT_TRAIT_KIND_GENDER: SoftTraitKind
SOFT_TRAIT_KIND_HEIGHT: SoftTraitKind
SOFT_TRAIT_KIND_WEIGHT: SoftTraitKind

class MechanismInfo(_message.Message):
    __slots__ = ("kind", "epsilon", "delta", "epsilon_coordinate", "epsilon_vector", "noise_std")
    KIND_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    EPSILON_COORDINATE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_VECTOR_FIELD_NUMBER: _ClassVar[int]
    NOISE_STD_FIELD_NUMBER: _ClassVar[int]
    kind: MechanismKind
    epsilon: float
    delta: float
    epsilon_coordinate: float
    epsilon_vector: float
    noise_std: float
    def __init__(self, kind: _Optional[_Union[MechanismKind, str]] = ..., epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., epsilon_coordinate: _Optional[float] = ..., epsilon_vector: _Optional[float] = ..., noise_std: _Optional[float] = ...) -> None: ...

class SoftTraitRelease(_message.Message):
    __slots__ = ("kind", "value", "epsilon", "mechanism")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    kind: SoftTraitKind
    value: float
    epsilon: float
    mechanism: str
    def __init__(self, kind: _Optional[_Union[SoftTraitKind, str]] = ..., value: _Optional[float] = ..., epsilon: _Optional[float] = ..., mechanism: _Optional[str] = ...) -> None: ...

class PerturbedTemplate(_message.Message):
    __slots__ = ("message_id", "device_id", "site", "capture_time", "bundle_id", "mechanism", "purpose", "subject", "track_id", "values", "soft_traits", "key_id", "decision", "device_signature", "claim_signature")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TIME_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_ID_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    TRACK_ID_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    SOFT_TRAITS_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    DECISION_FIELD_NUMBER: _ClassVar[int]
    DEVICE_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    CLAIM_SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    device_id: str
    site: str
    capture_time: _timestamp_pb2.Timestamp
    bundle_id: str
    mechanism: MechanismInfo
    purpose: Purpose
    subject: str
    track_id: str
    values: _containers.RepeatedScalarFieldContainer[float]
    soft_traits: _containers.RepeatedCompositeFieldContainer[SoftTraitRelease]
    key_id: str
    decision: DecisionRelease
    device_signature: str
    claim_signature: str
    def __init__(self, message_id: _Optional[str] = ..., device_id: _Optional[str] = ..., site: _Optional[str] = ..., capture_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., bundle_id: _Optional[str] = ..., mechanism: _Optional[_Union[MechanismInfo, _Mapping]] = ..., purpose: _Optional[_Union[Purpose, str]] = ..., subject: _Optional[str] = ..., track_id: _Optional[str] = ..., values: _Optional[_Iterable[float]] = ..., soft_traits: _Optional[_Iterable[_Union[SoftTraitRelease, _Mapping]]] = ..., key_id: _Optional[str] = ..., decision: _Optional[_Union[DecisionRelease, _Mapping]] = ..., device_signature: _Optional[str] = ..., claim_signature: _Optional[str] = ...) -> None: ...

class DecisionRelease(_message.Message):
    __slots__ = ("model_serial", "model_version", "label", "label_mechanism", "epsilon_label", "labels", "accepted", "frames_fused", "requested_by")
    MODEL_SERIAL_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    LABEL_FIELD_NUMBER: _ClassVar[int]
    LABEL_MECHANISM_FIELD_NUMBER: _ClassVar[int]
    EPSILON_LABEL_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    FRAMES_FUSED_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    model_serial: int
    model_version: str
    label: str
    label_mechanism: str
    epsilon_label: float
    labels: int
    accepted: bool
    frames_fused: int
    requested_by: str
    def __init__(self, model_serial: _Optional[int] = ..., model_version: _Optional[str] = ..., label: _Optional[str] = ..., label_mechanism: _Optional[str] = ..., epsilon_label: _Optional[float] = ..., labels: _Optional[int] = ..., accepted: _Optional[bool] = ..., frames_fused: _Optional[int] = ..., requested_by: _Optional[str] = ...) -> None: ...
