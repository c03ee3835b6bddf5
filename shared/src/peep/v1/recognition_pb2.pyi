import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from peep.v1 import template_pb2 as _template_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class IngestStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INGEST_STATUS_UNSPECIFIED: _ClassVar[IngestStatus]
    INGEST_STATUS_ACCEPTED: _ClassVar[IngestStatus]
    INGEST_STATUS_DUPLICATE: _ClassVar[IngestStatus]
    INGEST_STATUS_REJECTED: _ClassVar[IngestStatus]
INGEST_STATUS_UNSPECIFIED: IngestStatus
INGEST_STATUS_ACCEPTED: IngestStatus
INGEST_STATUS_DUPLICATE: IngestStatus
INGEST_STATUS_REJECTED: IngestStatus

class IngestAck(_message.Message):
    __slots__ = ("message_id", "status", "reason")
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    message_id: str
    status: IngestStatus
    reason: str
    def __init__(self, message_id: _Optional[str] = ..., status: _Optional[_Union[IngestStatus, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class IngestSummary(_message.Message):
    __slots__ = ("acks", "accepted", "duplicates", "rejected")
    ACKS_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FIELD_NUMBER: _ClassVar[int]
    acks: _containers.RepeatedCompositeFieldContainer[IngestAck]
    accepted: int
    duplicates: int
    rejected: int
    def __init__(self, acks: _Optional[_Iterable[_Union[IngestAck, _Mapping]]] = ..., accepted: _Optional[int] = ..., duplicates: _Optional[int] = ..., rejected: _Optional[int] = ...) -> None: ...

class IdentifyRequest(_message.Message):
    __slots__ = ("template", "top_k")
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    template: _template_pb2.PerturbedTemplate
    top_k: int
    def __init__(self, template: _Optional[_Union[_template_pb2.PerturbedTemplate, _Mapping]] = ..., top_k: _Optional[int] = ...) -> None: ...

class Candidate(_message.Message):
    __slots__ = ("subject", "probability")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    subject: str
    probability: float
    def __init__(self, subject: _Optional[str] = ..., probability: _Optional[float] = ...) -> None: ...

class IdentifyResponse(_message.Message):
    __slots__ = ("candidates", "subject", "unknown", "model_version")
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    candidates: _containers.RepeatedCompositeFieldContainer[Candidate]
    subject: str
    unknown: bool
    model_version: str
    def __init__(self, candidates: _Optional[_Iterable[_Union[Candidate, _Mapping]]] = ..., subject: _Optional[str] = ..., unknown: _Optional[bool] = ..., model_version: _Optional[str] = ...) -> None: ...

class VerifyRequest(_message.Message):
    __slots__ = ("template", "claimed_subject")
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    template: _template_pb2.PerturbedTemplate
    claimed_subject: str
    def __init__(self, template: _Optional[_Union[_template_pb2.PerturbedTemplate, _Mapping]] = ..., claimed_subject: _Optional[str] = ...) -> None: ...

class VerifyResponse(_message.Message):
    __slots__ = ("accepted", "score", "threshold", "target_far", "model_version")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SCORE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TARGET_FAR_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    score: float
    threshold: float
    target_far: float
    model_version: str
    def __init__(self, accepted: _Optional[bool] = ..., score: _Optional[float] = ..., threshold: _Optional[float] = ..., target_far: _Optional[float] = ..., model_version: _Optional[str] = ...) -> None: ...

class CheckClaimRequest(_message.Message):
    __slots__ = ("claimed_subject",)
    CLAIMED_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    claimed_subject: str
    def __init__(self, claimed_subject: _Optional[str] = ...) -> None: ...

class CheckClaimResponse(_message.Message):
    __slots__ = ("known", "model_version")
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    known: bool
    model_version: str
    def __init__(self, known: _Optional[bool] = ..., model_version: _Optional[str] = ...) -> None: ...

class EnrolSubjectRequest(_message.Message):
    __slots__ = ("subject", "templates", "message_ids")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_IDS_FIELD_NUMBER: _ClassVar[int]
    subject: str
    templates: _containers.RepeatedCompositeFieldContainer[_template_pb2.PerturbedTemplate]
    message_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, subject: _Optional[str] = ..., templates: _Optional[_Iterable[_Union[_template_pb2.PerturbedTemplate, _Mapping]]] = ..., message_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class EnrolSubjectResponse(_message.Message):
    __slots__ = ("subject", "templates")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    templates: int
    def __init__(self, subject: _Optional[str] = ..., templates: _Optional[int] = ...) -> None: ...

class TrainRequest(_message.Message):
    __slots__ = ("preset", "background")
    PRESET_FIELD_NUMBER: _ClassVar[int]
    BACKGROUND_FIELD_NUMBER: _ClassVar[int]
    preset: str
    background: bool
    def __init__(self, preset: _Optional[str] = ..., background: _Optional[bool] = ...) -> None: ...

class TrainResponse(_message.Message):
    __slots__ = ("model_version", "started", "validation_accuracy", "n_templates", "n_subjects")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    N_TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    N_SUBJECTS_FIELD_NUMBER: _ClassVar[int]
    model_version: str
    started: bool
    validation_accuracy: float
    n_templates: int
    n_subjects: int
    def __init__(self, model_version: _Optional[str] = ..., started: _Optional[bool] = ..., validation_accuracy: _Optional[float] = ..., n_templates: _Optional[int] = ..., n_subjects: _Optional[int] = ...) -> None: ...

class ModelStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("model_version", "trained_at", "n_subjects", "n_templates", "validation_accuracy", "unknown_threshold", "verify_threshold", "training", "training_progress", "bundle_id", "device_model_serial", "device_models_status")
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAINED_AT_FIELD_NUMBER: _ClassVar[int]
    N_SUBJECTS_FIELD_NUMBER: _ClassVar[int]
    N_TEMPLATES_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_ACCURACY_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    VERIFY_THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FIELD_NUMBER: _ClassVar[int]
    TRAINING_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    BUNDLE_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MODEL_SERIAL_FIELD_NUMBER: _ClassVar[int]
    DEVICE_MODELS_STATUS_FIELD_NUMBER: _ClassVar[int]
    model_version: str
    trained_at: _timestamp_pb2.Timestamp
    n_subjects: int
    n_templates: int
    validation_accuracy: float
    unknown_threshold: float
    verify_threshold: float
    training: bool
    training_progress: float
    bundle_id: str
    device_model_serial: int
    device_models_status: str
    def __init__(self, model_version: _Optional[str] = ..., trained_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., n_subjects: _Optional[int] = ..., n_templates: _Optional[int] = ..., validation_accuracy: _Optional[float] = ..., unknown_threshold: _Optional[float] = ..., verify_threshold: _Optional[float] = ..., training: _Optional[bool] = ..., training_progress: _Optional[float] = ..., bundle_id: _Optional[str] = ..., device_model_serial: _Optional[int] = ..., device_models_status: _Optional[str] = ...) -> None: ...

class EraseSubjectRequest(_message.Message):
    __slots__ = ("subject", "retrain")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    RETRAIN_FIELD_NUMBER: _ClassVar[int]
    subject: str
    retrain: bool
    def __init__(self, subject: _Optional[str] = ..., retrain: _Optional[bool] = ...) -> None: ...

class EraseSubjectResponse(_message.Message):
    __slots__ = ("templates_deleted", "soft_traits_deleted", "model_version")
    TEMPLATES_DELETED_FIELD_NUMBER: _ClassVar[int]
    SOFT_TRAITS_DELETED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    templates_deleted: int
    soft_traits_deleted: int
    model_version: str
    def __init__(self, templates_deleted: _Optional[int] = ..., soft_traits_deleted: _Optional[int] = ..., model_version: _Optional[str] = ...) -> None: ...

class GetBundleRequest(_message.Message):
    __slots__ = ("bundle_id",)
    BUNDLE_ID_FIELD_NUMBER: _ClassVar[int]
    bundle_id: str
    def __init__(self, bundle_id: _Optional[str] = ...) -> None: ...

class BundleFile(_message.Message):
    __slots__ = ("name", "content")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    content: bytes
    def __init__(self, name: _Optional[str] = ..., content: _Optional[bytes] = ...) -> None: ...

class BundleFiles(_message.Message):
    __slots__ = ("bundle_id", "files")
    BUNDLE_ID_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    bundle_id: str
    files: _containers.RepeatedCompositeFieldContainer[BundleFile]
    def __init__(self, bundle_id: _Optional[str] = ..., files: _Optional[_Iterable[_Union[BundleFile, _Mapping]]] = ...) -> None: ...

class GetDeviceModelRequest(_message.Message):
    __slots__ = ("bundle_id", "key_id", "have_serial")
    BUNDLE_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    HAVE_SERIAL_FIELD_NUMBER: _ClassVar[int]
    bundle_id: str
    key_id: str
    have_serial: int
    def __init__(self, bundle_id: _Optional[str] = ..., key_id: _Optional[str] = ..., have_serial: _Optional[int] = ...) -> None: ...

class DeviceModelFiles(_message.Message):
    __slots__ = ("serial", "files", "unchanged")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    FILES_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    serial: int
    files: _containers.RepeatedCompositeFieldContainer[BundleFile]
    unchanged: bool
    def __init__(self, serial: _Optional[int] = ..., files: _Optional[_Iterable[_Union[BundleFile, _Mapping]]] = ..., unchanged: _Optional[bool] = ...) -> None: ...

class PublishBundleResponse(_message.Message):
    __slots__ = ("bundle_id",)
    BUNDLE_ID_FIELD_NUMBER: _ClassVar[int]
    bundle_id: str
    def __init__(self, bundle_id: _Optional[str] = ...) -> None: ...

class StreamEventsRequest(_message.Message):
    __slots__ = ("site", "after_seq")
    SITE_FIELD_NUMBER: _ClassVar[int]
    AFTER_SEQ_FIELD_NUMBER: _ClassVar[int]
    site: str
    after_seq: int
    def __init__(self, site: _Optional[str] = ..., after_seq: _Optional[int] = ...) -> None: ...

class RecognitionEvent(_message.Message):
    __slots__ = ("event_id", "time", "site", "device_id", "message_id", "track_id", "purpose", "subject", "unknown", "probability", "claimed_subject", "accepted", "model_version", "releases_fused", "seq", "decided_on", "epsilon_label", "model_serial", "template_sha256", "requested_by")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_ID_FIELD_NUMBER: _ClassVar[int]
    TRACK_ID_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    RELEASES_FUSED_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    DECIDED_ON_FIELD_NUMBER: _ClassVar[int]
    EPSILON_LABEL_FIELD_NUMBER: _ClassVar[int]
    MODEL_SERIAL_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_SHA256_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    time: _timestamp_pb2.Timestamp
    site: str
    device_id: str
    message_id: str
    track_id: str
    purpose: _template_pb2.Purpose
    subject: str
    unknown: bool
    probability: float
    claimed_subject: str
    accepted: bool
    model_version: str
    releases_fused: int
    seq: int
    decided_on: str
    epsilon_label: float
    model_serial: int
    template_sha256: str
    requested_by: str
    def __init__(self, event_id: _Optional[str] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., site: _Optional[str] = ..., device_id: _Optional[str] = ..., message_id: _Optional[str] = ..., track_id: _Optional[str] = ..., purpose: _Optional[_Union[_template_pb2.Purpose, str]] = ..., subject: _Optional[str] = ..., unknown: _Optional[bool] = ..., probability: _Optional[float] = ..., claimed_subject: _Optional[str] = ..., accepted: _Optional[bool] = ..., model_version: _Optional[str] = ..., releases_fused: _Optional[int] = ..., seq: _Optional[int] = ..., decided_on: _Optional[str] = ..., epsilon_label: _Optional[float] = ..., model_serial: _Optional[int] = ..., template_sha256: _Optional[str] = ..., requested_by: _Optional[str] = ...) -> None: ...

class DeviceReportRequest(_message.Message):
    __slots__ = ("device_id", "site", "report")
    DEVICE_ID_FIELD_NUMBER: _ClassVar[int]
    SITE_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    device_id: str
    site: str
    report: bytes
    def __init__(self, device_id: _Optional[str] = ..., site: _Optional[str] = ..., report: _Optional[bytes] = ...) -> None: ...

class DeviceReportAck(_message.Message):
    __slots__ = ("received_at",)
    RECEIVED_AT_FIELD_NUMBER: _ClassVar[int]
    received_at: float
    def __init__(self, received_at: _Optional[float] = ...) -> None: ...
