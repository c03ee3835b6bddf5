"""The operator console's section (``[console]``)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from peep.server.config.base import ConfigModel, check_listen, resolve_path
from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)


class ConsoleConfig(ConfigModel):
    """The operator console (``peep.server.console``): a web page served by ``peep serve`` over HTTPS with the
    gRPC listener's certificate (``grpc.tls``). Off unless the section is present. Accounts, sessions, alerts and
    the console's audit log are in the server's database; ``peep console add-user`` creates accounts. docs/OPERATIONS.md
    """

    listen: str = Field(
        default="127.0.0.1:8443",
        description="HOST:PORT of the console's HTTPS listener (0 = pick a free port); a reverse proxy may front it",
    )
    session_lifetime_s: float = Field(
        default=8 * 3600.0,
        ge=300.0,
        le=7 * 86_400.0,
        description="a login lasts at most this long (a shift), whatever the activity",
    )
    session_idle_s: float = Field(
        default=1800.0, ge=60.0, le=86_400.0, description="a session unused for this long ends (at most the lifetime)"
    )
    login_attempts: int = Field(
        default=5,
        ge=1,
        le=100,
        description=(
            "failed logins allowed per account name and per client address within login_window_s; more are "
            "refused (HTTP 429) until the window has passed, even with the right password"
        ),
    )
    login_window_s: float = Field(default=900.0, ge=10.0, le=86_400.0, description="the window of login_attempts")
    recent_events: int = Field(
        default=500, ge=10, le=100_000, description="recognitions the Live page keeps in memory (newest first)"
    )
    audit_dir: Path | None = Field(
        default=None,
        description="a `peep audit --out` directory whose audit.json the Privacy page summarises (none: not shown)",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "addresses or CIDR networks of the reverse proxies in front of the console whose X-Forwarded-For and "
            "X-Forwarded-Proto it believes, so the per-address login throttle and the audit log see the client "
            "rather than the proxy; empty: the headers are ignored"
        ),
    )
    header_timeout_s: float = Field(
        default=10.0,
        ge=1.0,
        le=300.0,
        description=(
            "a connection must deliver a whole request (head and form) within this many seconds of its TLS "
            "handshake or of its previous response, else it is closed; a request once received (a Live event "
            "stream) is not cut"
        ),
    )
    tls_handshake_timeout_s: float = Field(
        default=5.0,
        ge=1.0,
        le=60.0,
        description=(
            "a connection must complete its TLS handshake within this many seconds of being accepted, else it is "
            "closed; until then it counts toward max_connections and max_connections_per_address like any other"
        ),
    )
    max_connections: int = Field(
        default=512,
        ge=16,
        le=100_000,
        description=(
            "open connections in all; one more closes the connection that has waited longest for its request, "
            "or is refused when every connection is busy with one"
        ),
    )
    max_connections_per_address: int = Field(
        default=64,
        ge=2,
        le=100_000,
        description=(
            "open connections per client address (a reverse proxy's own address: everyone behind it shares it); "
            "one more closes that address's connection that has waited longest for its request, or is refused"
        ),
    )

    @field_validator("listen")
    @classmethod
    def check_listen(cls, v: str) -> str:
        return check_listen(v)

    @field_validator("trusted_proxies")
    @classmethod
    def check_trusted_proxies(cls, v: list[str]) -> list[str]:
        for i, item in enumerate(v):
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                # "*" would let any client name its own address and walk around the per-address throttle.
                raise ValueError(
                    f"trusted_proxies[{i}]: expected an IP address or CIDR network such as 10.0.0.5 or 10.0.0.0/24, "
                    f"received {item[:64]!r}"
                ) from None
        return v

    @field_validator("audit_dir", mode="after")
    @classmethod
    def check_paths(cls, v: Path | None, info: ValidationInfo) -> Path | None:
        return resolve_path(v, info)

    @model_validator(mode="after")
    def _connection_budgets(self) -> ConsoleConfig:
        if self.max_connections_per_address > self.max_connections:
            raise ValueError(
                f"max_connections_per_address: expected at most max_connections ({self.max_connections}), "
                f"received {self.max_connections_per_address}"
            )
        return self
