"""Who is calling: per-device bearer tokens or mTLS certificates, and admins.

The device registry comes from ``[[auth.devices]]`` in ``server.toml``: a
device id, optionally the site it belongs to, and either the SHA-256 of its
bearer token or a reference to the token. With ``grpc.tls.client_ca`` set, a
client certificate signed by that CA authenticates too: its common name (CN)
is the device id (or an admin, if listed in ``auth.admin_common_names``).
A bearer token sent over an mTLS connection must name the same device as the
certificate (an admin certificate may carry any token).

:class:`AuthInterceptor` runs before every handler: health checking is open
(and server reflection when ``grpc.reflection = "open"``, for development);
everything else needs an identity (else ``UNAUTHENTICATED``), and :data:`ADMIN_METHODS` need an admin (else
``PERMISSION_DENIED``). Handlers read the caller with :func:`current_identity`
and enforce the per-message rule: a device may only send templates whose
``device_id`` is its own (and whose ``site`` is its registered site).

Enrolment is a right of its own: a template with purpose ENROLL (which names
a subject the server then trains on) is accepted from an admin, or from a
device whose registry entry says ``enrolment_desk = true``; ordinary cameras
may only identify and verify (:meth:`Ingestor.authorise
<peep.server.ingest.ingestor.Ingestor.authorise>`, for gRPC and MQTT alike).
"""

from __future__ import annotations

import contextvars
import hashlib
import hmac
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from peep.server.config import DeviceConfig

__all__ = [
    "HEALTH_PREFIXES",
    "REFLECTION_PREFIXES",
    "AuthError",
    "AuthInterceptor",
    "DeviceRegistry",
    "Identity",
    "Undecodable",
    "authenticate",
    "authorize_admin",
    "current_identity",
]

if TYPE_CHECKING:
    from peep.server.ingest.contacts import DeviceContacts

_RECOGNITION = "/peep.v1.RecognitionService/"
_QBBS = "/peep.v1.QbbsService/"

#: Methods that need an admin credential.
ADMIN_METHODS = frozenset(
    {
        _RECOGNITION + "Train",
        _RECOGNITION + "EraseSubject",
        _RECOGNITION + "EnrolSubject",
        _RECOGNITION + "PublishBundle",
        _QBBS + "EnrolSoftTraits",
        _QBBS + "Query",
        _QBBS + "GetOdometer",
    }
)
HEALTH_PREFIXES = ("/grpc.health.v1.Health/",)
REFLECTION_PREFIXES = ("/grpc.reflection.v1alpha.ServerReflection/", "/grpc.reflection.v1.ServerReflection/")
#: Methods open without credentials by default (infrastructure probes); reflection is added
#: only with ``grpc.reflection = "open"``.
PUBLIC_PREFIXES = HEALTH_PREFIXES


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller."""

    name: str
    is_admin: bool
    site: str | None = None
    via: str = "token"
    enrolment_desk: bool = False

    @property
    def device_id(self) -> str | None:
        return None if self.is_admin else self.name

    @property
    def may_enrol(self) -> bool:
        """Whether this caller may send ENROLL templates (an admin or an enrolment desk)."""
        return self.is_admin or self.enrolment_desk


_current: contextvars.ContextVar[Identity | None] = contextvars.ContextVar("peep_identity", default=None)


def current_identity() -> Identity | None:
    """The caller of the RPC being handled on this thread (set by :class:`AuthInterceptor`)."""
    return _current.get()


class DeviceRegistry:
    """Devices and admin credentials.

    Parameters
    ----------
    devices : iterable of DeviceConfig
    token_sha256 : mapping of device id to hex SHA-256 of its token
    admin_token_sha256 : str, optional
    admin_common_names : iterable of str
    require_signatures : bool
        Every MQTT template must carry its device's signature (``auth.require_device_signatures``).
    """

    def __init__(
        self,
        devices: Iterable[DeviceConfig] = (),
        *,
        token_sha256: Mapping[str, str] | None = None,
        admin_token_sha256: str | None = None,
        admin_common_names: Iterable[str] = (),
        require_signatures: bool = False,
    ) -> None:
        from peep.core.signing import parse_public_key_text

        self.devices = {d.id: d for d in devices}
        self.require_signatures = require_signatures
        self._signing_keys = {
            d.id: parse_public_key_text(d.signing_key)
            for d in self.devices.values()
            if d.enabled and getattr(d, "signing_key", None)
        }
        self._by_hash: dict[str, Identity] = {}
        for dev_id, h in (token_sha256 or {}).items():
            d = self.devices.get(dev_id)
            if d is not None and d.enabled:
                self._by_hash[h.lower()] = Identity(
                    name=dev_id, is_admin=False, site=d.site, via="token", enrolment_desk=d.enrolment_desk
                )
        self._admin_hash = admin_token_sha256.lower() if admin_token_sha256 else None
        self._admin_cns = frozenset(admin_common_names)

    def __len__(self) -> int:
        return len(self.devices)

    def is_registered(self, device_id: str) -> bool:
        d = self.devices.get(device_id)
        return d is not None and d.enabled

    def signing_key(self, device_id: str) -> Any:
        """The Ed25519 public key registered for ``device_id`` (``auth.devices[].signing_key``), or None."""
        return self._signing_keys.get(device_id)

    def site_of(self, device_id: str) -> str | None:
        d = self.devices.get(device_id)
        return None if d is None else d.site

    def is_door(self, device_id: str) -> bool:
        """Whether ``device_id`` is registered, enabled and configured as a door (``auth.devices[].door``)."""
        d = self.devices.get(device_id)
        return d is not None and d.enabled and bool(getattr(d, "door", False))

    def is_enrolment_desk(self, device_id: str) -> bool:
        """Whether ``device_id`` is registered, enabled and configured as an enrolment desk."""
        d = self.devices.get(device_id)
        return d is not None and d.enabled and d.enrolment_desk

    def by_token(self, token: str) -> Identity | None:
        h = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        if self._admin_hash is not None and hmac.compare_digest(h, self._admin_hash):
            return Identity(name="admin", is_admin=True, via="token")
        return self._by_hash.get(h)

    def by_certificate(self, common_name: str) -> Identity | None:
        if common_name in self._admin_cns:
            return Identity(name=common_name, is_admin=True, via="certificate")
        d = self.devices.get(common_name)
        if d is None or not d.enabled:
            return None
        return Identity(
            name=common_name, is_admin=False, site=d.site, via="certificate", enrolment_desk=d.enrolment_desk
        )


class AuthError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def authenticate(
    registry: DeviceRegistry, metadata: Iterable[tuple[str, Any]], auth_context: Mapping[str, Any]
) -> Identity:
    """Identify a caller from its metadata (bearer token) or TLS auth context (client certificate CN)."""
    token = None
    for key, value in metadata:
        if key == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
            scheme, _, rest = text.partition(" ")
            if scheme.lower() != "bearer" or not rest.strip():
                raise AuthError(grpc.StatusCode.UNAUTHENTICATED, "authorization: expected 'Bearer <token>'")
            token = rest.strip()
            break
    cert_ident = None
    cns = auth_context.get("x509_common_name") or []
    if cns:
        cn = cns[0].decode() if isinstance(cns[0], bytes) else str(cns[0])
        cert_ident = registry.by_certificate(cn)
        if cert_ident is None:
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED, f"certificate: CN {cn!r} is not a registered device or admin"
            )
    if token is not None:
        ident = registry.by_token(token)
        if ident is None:
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED,
                "authorization: the bearer token is not registered (or its device is disabled)",
            )
        if cert_ident is not None and not cert_ident.is_admin and ident.name != cert_ident.name:
            raise AuthError(
                grpc.StatusCode.UNAUTHENTICATED,
                f"credentials: the bearer token names {ident.name!r} but the client certificate names "
                f"{cert_ident.name!r}",
            )
        return ident
    if cert_ident is not None:
        return cert_ident
    raise AuthError(
        grpc.StatusCode.UNAUTHENTICATED,
        "credentials: expected 'authorization: Bearer <token>' metadata or a client certificate",
    )


class Undecodable:
    """Stands in for a request message that could not be parsed (so handlers can say so)."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error

    def __str__(self) -> str:
        return f"payload: expected a serialised protobuf message, parsing failed ({self.error})"


def _safe(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """A deserializer that returns :class:`Undecodable` instead of failing the call with INTERNAL."""
    if deserializer is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserializer(data)
        except Exception as exc:  # protobuf DecodeError and friends
            return Undecodable(str(exc) or type(exc).__name__)

    return parse


def authorize_admin(context: grpc.ServicerContext, method: str = "") -> None:
    """Abort with PERMISSION_DENIED unless the current caller is an admin.

    For servicers hosted next to RecognitionService (QBBS passes it as its
    ``authorize_admin``); :class:`AuthInterceptor` has already authenticated
    the caller and, for :data:`ADMIN_METHODS`, required an admin.
    """
    ident = current_identity()
    if ident is None or not ident.is_admin:
        who = "an unauthenticated caller" if ident is None else f"device {ident.name!r}"
        context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method or 'this method'}: expected an admin credential, received {who}",
        )


def _until_done(responses: Iterator[Any] | None, call: Any) -> Iterator[Any]:
    """``responses``, closing ``call`` when the stream ends (not only when gRPC reports the call's end)."""
    try:
        if responses is not None:
            yield from responses
    finally:
        call.close()


def _wrap(
    behavior: Callable[..., Any],
    check: Callable[[Any], Identity | None],
    unary: bool,
    contacts: DeviceContacts | None = None,
    streams_responses: bool = False,
) -> Callable[..., Any]:
    def wrapper(request_or_iterator: Any, context: grpc.ServicerContext) -> Any:
        ident = check(context)
        _current.set(ident)
        if contacts is None or ident is None or ident.is_admin:
            if unary and isinstance(request_or_iterator, Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(request_or_iterator))
            return behavior(request_or_iterator, context)
        call = contacts.opened(ident.name)
        # The termination callback ends the call whatever way it ends (cancelled by the peer, aborted, ended
        # idle by the stream limiter); False means the call has already terminated.
        if not context.add_callback(call.close):
            call.close()
        try:
            if unary and isinstance(request_or_iterator, Undecodable):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(request_or_iterator))
            out = behavior(request_or_iterator, context)
        except BaseException:
            call.close()
            raise
        if streams_responses:
            return _until_done(out, call)
        call.close()
        return out

    return wrapper


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Authenticate every RPC except ``public_prefixes`` (health); require admin for :data:`ADMIN_METHODS`.

    Parameters
    ----------
    registry : DeviceRegistry
    admin_methods : iterable of str
        Full method names that need an admin credential.
    public_prefixes : iterable of str
        Method name prefixes open without credentials.
    contacts : DeviceContacts, optional
        Told of every call an authenticated device makes, from its start to its end (the console's
        gRPC device statuses); admins and unauthenticated callers are not recorded.
    """

    def __init__(
        self,
        registry: DeviceRegistry,
        admin_methods: Iterable[str] = ADMIN_METHODS,
        public_prefixes: Iterable[str] = PUBLIC_PREFIXES,
        *,
        contacts: DeviceContacts | None = None,
    ) -> None:
        self.registry = registry
        self.contacts = contacts
        self.admin_methods = frozenset(admin_methods)
        self.public_prefixes = tuple(public_prefixes)
        # The wrapped handler of each method, built on its first call: a handler depends only on
        # the method (and on the registered one it wraps, which does not change while serving).
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    def intercept_service(self, continuation: Callable[[Any], Any], handler_call_details: Any) -> Any:
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None:
            return None
        if method.startswith(self.public_prefixes):
            _current.set(None)
            return handler
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._wrap_handler(method, handler)
        self._wrapped[method] = (handler, wrapped)
        return wrapped

    def _wrap_handler(self, method: str, handler: Any) -> Any:
        needs_admin = method in self.admin_methods
        registry = self.registry

        def check(context: grpc.ServicerContext) -> Identity | None:
            try:
                ident = authenticate(registry, context.invocation_metadata(), context.auth_context())
            except AuthError as exc:
                context.abort(exc.code, str(exc))
                raise  # unreachable: abort raises
            if needs_admin and not ident.is_admin:
                context.abort(
                    grpc.StatusCode.PERMISSION_DENIED,
                    f"{method}: expected an admin credential, received device {ident.name!r}",
                )
            return ident

        deser = _safe(handler.request_deserializer)
        ser = handler.response_serializer
        c = self.contacts
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(_wrap(handler.unary_unary, check, True, c), deser, ser)
        if handler.unary_stream:
            fn = _wrap(handler.unary_stream, check, True, c, streams_responses=True)
            return grpc.unary_stream_rpc_method_handler(fn, deser, ser)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(_wrap(handler.stream_unary, check, False, c), deser, ser)
        fn = _wrap(handler.stream_stream, check, False, c, streams_responses=True)
        return grpc.stream_stream_rpc_method_handler(fn, deser, ser)
