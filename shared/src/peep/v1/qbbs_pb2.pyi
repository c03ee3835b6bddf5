from peep.v1 import template_pb2 as _template_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SoftTraitValue(_message.Message):
    __slots__ = ("trait", "value")
    TRAIT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    trait: str
    value: float
    def __init__(self, trait: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...

class EnrolSoftTraitsRequest(_message.Message):
    __slots__ = ("subject", "traits")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    TRAITS_FIELD_NUMBER: _ClassVar[int]
    subject: str
    traits: _containers.RepeatedCompositeFieldContainer[SoftTraitValue]
    def __init__(self, subject: _Optional[str] = ..., traits: _Optional[_Iterable[_Union[SoftTraitValue, _Mapping]]] = ...) -> None: ...

class EnrolSoftTraitsResponse(_message.Message):
    __slots__ = ("subject", "traits")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    TRAITS_FIELD_NUMBER: _ClassVar[int]
    subject: str
    traits: int
    def __init__(self, subject: _Optional[str] = ..., traits: _Optional[int] = ...) -> None: ...

class QbbsQueryRequest(_message.Message):
    __slots__ = ("subject", "trait")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    TRAIT_FIELD_NUMBER: _ClassVar[int]
    subject: str
    trait: str
    def __init__(self, subject: _Optional[str] = ..., trait: _Optional[str] = ...) -> None: ...

class QbbsQueryResponse(_message.Message):
    __slots__ = ("subject", "trait", "value", "epsilon_spent", "epsilon_total")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    TRAIT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_TOTAL_FIELD_NUMBER: _ClassVar[int]
    subject: str
    trait: str
    value: float
    epsilon_spent: float
    epsilon_total: float
    def __init__(self, subject: _Optional[str] = ..., trait: _Optional[str] = ..., value: _Optional[float] = ..., epsilon_spent: _Optional[float] = ..., epsilon_total: _Optional[float] = ...) -> None: ...

class QbbsVerifyRequest(_message.Message):
    __slots__ = ("template", "claimed_subject", "observed")
    TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_SUBJECT_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_FIELD_NUMBER: _ClassVar[int]
    template: _template_pb2.PerturbedTemplate
    claimed_subject: str
    observed: _containers.RepeatedCompositeFieldContainer[SoftTraitValue]
    def __init__(self, template: _Optional[_Union[_template_pb2.PerturbedTemplate, _Mapping]] = ..., claimed_subject: _Optional[str] = ..., observed: _Optional[_Iterable[_Union[SoftTraitValue, _Mapping]]] = ...) -> None: ...

class TraitScore(_message.Message):
    __slots__ = ("trait", "log_likelihood", "weight")
    TRAIT_FIELD_NUMBER: _ClassVar[int]
    LOG_LIKELIHOOD_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    trait: str
    log_likelihood: float
    weight: float
    def __init__(self, trait: _Optional[str] = ..., log_likelihood: _Optional[float] = ..., weight: _Optional[float] = ...) -> None: ...

class QbbsVerifyResponse(_message.Message):
    __slots__ = ("accepted", "fused_score", "threshold", "face_score", "log_p_genuine_face", "traits", "epsilon_spent", "epsilon_total")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    FUSED_SCORE_FIELD_NUMBER: _ClassVar[int]
    THRESHOLD_FIELD_NUMBER: _ClassVar[int]
    FACE_SCORE_FIELD_NUMBER: _ClassVar[int]
    LOG_P_GENUINE_FACE_FIELD_NUMBER: _ClassVar[int]
    TRAITS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_TOTAL_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    fused_score: float
    threshold: float
    face_score: float
    log_p_genuine_face: float
    traits: _containers.RepeatedCompositeFieldContainer[TraitScore]
    epsilon_spent: float
    epsilon_total: float
    def __init__(self, accepted: _Optional[bool] = ..., fused_score: _Optional[float] = ..., threshold: _Optional[float] = ..., face_score: _Optional[float] = ..., log_p_genuine_face: _Optional[float] = ..., traits: _Optional[_Iterable[_Union[TraitScore, _Mapping]]] = ..., epsilon_spent: _Optional[float] = ..., epsilon_total: _Optional[float] = ...) -> None: ...

class OdometerRequest(_message.Message):
    __slots__ = ("subject",)
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    subject: str
    def __init__(self, subject: _Optional[str] = ...) -> None: ...

class OdometerResponse(_message.Message):
    __slots__ = ("subject", "epsilon_spent", "epsilon_cap", "queries")
    SUBJECT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    EPSILON_CAP_FIELD_NUMBER: _ClassVar[int]
    QUERIES_FIELD_NUMBER: _ClassVar[int]
    subject: str
    epsilon_spent: float
    epsilon_cap: float
    queries: int
    def __init__(self, subject: _Optional[str] = ..., epsilon_spent: _Optional[float] = ..., epsilon_cap: _Optional[float] = ..., queries: _Optional[int] = ...) -> None: ...
