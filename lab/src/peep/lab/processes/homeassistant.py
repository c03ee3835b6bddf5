"""A real Home Assistant (:class:`HomeAssistant`) on a free loopback port, linked to an MQTT broker, read and driven
through its REST API: what a site's home automation sees of the devices the server announces by MQTT discovery.

It runs from its own venv (``bash scripts/bootstrap.sh ha``: ``.venv-ha`` at the checkout's root, or
``$PEEP_HA_VENV``; ``lab/homeassistant/README.md`` says which version and why), with a configuration seeded before
its start: an owner and a long-lived access token this module makes itself, onboarding done, and the MQTT
integration's config entry, so no user interface nor onboarding flow is needed and the token is known up front.
The HTTP client is the standard library's (urllib): the lab needs no Home Assistant package of its own.

With ``frontend=True`` it also serves its web page, which :meth:`HomeAssistant.screenshot` opens in a headless
Chromium (Debian's ``chromium`` and ``chromium-driver``, driven by selenium) logged in with the same token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self

from peep.lab.processes.control import PartUnavailable, checkout_file, stop_process, wait_for
from peep.lab.processes.ports import free_port, listens_on

__all__ = ["DISCOVERY_PREFIX", "FrontendPage", "HomeAssistant", "ha_venv"]

#: The topic root Home Assistant's MQTT integration subscribes to for discovery (its default); it also
#: announces itself on ``<prefix>/status``, not retained: ``online`` once connected, ``offline`` as its will.
DISCOVERY_PREFIX = "homeassistant"
#: The version the venv is locked to (lab/homeassistant/requirements-<version>.txt); its storage formats are the
#: ones :meth:`HomeAssistant._seed` writes.
HA_VERSION = "2024.3.3"
#: The long-lived token's lifetime: ten years, as Home Assistant's own long-lived tokens may have.
_TOKEN_LIFESPAN_S = 3650 * 86400.0
#: Debian's Chromium and its driver (apt-get install chromium chromium-driver), as the console's browser tests use.
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: What the page shows, read through every shadow root (the frontend is web components: ``innerText`` of the
#: document sees none of it): each data-table row's text, cells joined by `` | ``, and all of the page's text.
_READ_PAGE_JS = """
const rows = [], text = [];
const deep = (n, out) => {
  if (n.nodeType === Node.TEXT_NODE) { const t = n.textContent.trim(); if (t) out.push(t); return; }
  if (n.localName === 'style' || n.localName === 'script') return;
  if (n.shadowRoot) deep(n.shadowRoot, out);
  for (const c of n.childNodes) deep(c, out);
};
const find = (n) => {
  if (n.classList && n.classList.contains('mdc-data-table__row')) {
    const cells = []; deep(n, cells); rows.push(cells.join(' | ')); return;
  }
  if (n.shadowRoot) find(n.shadowRoot);
  for (const c of n.children || []) find(c);
};
find(document);
deep(document, text);
return {rows: rows, text: text.join('\\n'), url: location.href};
"""


def ha_venv() -> Path:
    """The venv Home Assistant runs from: ``$PEEP_HA_VENV``, else the checkout's ``.venv-ha``."""
    return Path(os.environ.get("PEEP_HA_VENV") or checkout_file(".venv-ha"))


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _hs256_jwt(payload: dict[str, Any], key: str) -> str:
    """An HS256 JSON Web Token: the form of Home Assistant's access tokens, signed with a refresh token's key."""
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT"}, separators=(",", ":")).encode())
    body = _b64(json.dumps(payload, separators=(",", ":")).encode())
    sig = hmac.new(key.encode(), f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{_b64(sig)}"


@dataclass(frozen=True)
class FrontendPage:
    """What :meth:`HomeAssistant.screenshot` read of the page it saved, from the DOM through its shadow roots.

    Attributes
    ----------
    url : str
        The page's address when saved (an address under ``/auth/`` would mean the login did not take).
    rows : list of str
        Each data-table row's text, its cells joined by `` | `` (``door-1 Lock | lock.door_1_lock | MQTT | ...``).
    text : str
        All the text of the page, hidden menus included, one text node a line.
    """

    url: str
    rows: list[str]
    text: str


def _store(key: str, data: dict[str, Any], version: int = 1, minor: int = 1) -> dict[str, Any]:
    """A file of Home Assistant's ``.storage`` folder."""
    return {"version": version, "minor_version": minor, "key": key, "data": data}


class HomeAssistant:
    """``hass -c <workdir>/config --skip-pip`` with a seeded configuration, its MQTT integration on a given broker.

    Only the integrations Home Assistant always loads run, plus ``http`` on a free port of 127.0.0.1, ``api`` and
    ``mqtt`` (no ``default_config``: no recorder database, no zeroconf nor cloud), so a start takes seconds.

    Parameters
    ----------
    workdir : Path
        Its folder (created): ``config/`` (the configuration, ``hass.log``), ``tmp/`` (its TMPDIR).
    mqtt_host, mqtt_port : str, int
        The broker its MQTT integration connects to.
    username, password : str or None
        The broker account (None: anonymous).
    ca : Path or None
        The CA certificate the broker's TLS certificate is verified with; None connects without TLS.
    discovery_prefix : str
        The discovery topic root (:data:`DISCOVERY_PREFIX`, Home Assistant's default, unless a site changed it).
    log_level : str
        Home Assistant's default log level (``logger:``); ``debug`` also logs each MQTT message received.
    frontend : bool
        Also load ``frontend`` (its web page and the websocket API it needs), for :meth:`screenshot`; off by
        default, as a test of MQTT discovery needs none of it.

    Raises
    ------
    PartUnavailable
        The Home Assistant venv is missing (:func:`ha_venv`; ``bash scripts/bootstrap.sh ha`` makes it).

    Examples
    --------
    >>> with HomeAssistant(tmp / "ha", "localhost", broker.port, ca=ca_pem) as ha:  # doctest: +SKIP
    ...     ha.wait_state("lock.door_1", lambda s: s is not None and s["state"] == "locked")
    """

    def __init__(self, workdir: Path, mqtt_host: str, mqtt_port: int, *, username: str | None = None,
                 password: str | None = None, ca: Path | None = None, discovery_prefix: str = DISCOVERY_PREFIX,
                 log_level: str = "info", frontend: bool = False) -> None:  # fmt: skip
        venv = ha_venv()
        self.hass = venv / "bin" / "hass"
        if not os.access(self.hass, os.X_OK):
            raise PartUnavailable(
                f"{self.hass} not found: Home Assistant runs from its own venv (bash scripts/bootstrap.sh ha)"
            )
        self.workdir = workdir
        self.config_dir = workdir / "config"
        self.mqtt = {"broker": mqtt_host, "port": mqtt_port, "discovery": True}
        if discovery_prefix != DISCOVERY_PREFIX:
            self.mqtt["discovery_prefix"] = discovery_prefix
        if username is not None:
            self.mqtt.update(username=username, password=password or "")
        if ca is not None:
            # The entry holds the PEM text itself, as Home Assistant's own config flow stores an uploaded CA.
            self.mqtt.update(certificate=Path(ca).read_text(), tls_insecure=False)
        self.log_level = log_level
        self.frontend = frontend
        self.http_port = 0
        self.url = ""
        self.token = ""
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------------ start and stop

    def _seed(self) -> None:
        """Write ``configuration.yaml`` and ``.storage`` (auth, onboarding, the MQTT entry); set :attr:`token`.

        The formats are Home Assistant 2024.3.3's (auth 1.1, onboarding 4, core.config_entries 1.1). The token is
        what its auth manager issues for a long-lived refresh token: a JWT ``{iss: <refresh token id>, iat, exp}``
        signed with that refresh token's ``jwt_key``.
        """
        cfg = self.config_dir
        (cfg / ".storage").mkdir(parents=True, exist_ok=True)
        # http binds 127.0.0.1 only: a test's Home Assistant has an owner token anyone on the network could use.
        (cfg / "configuration.yaml").write_text(
            "homeassistant:\n  name: peep-test\n  latitude: 52.0\n  longitude: 4.0\n  elevation: 0\n"
            "  unit_system: metric\n  time_zone: UTC\n  currency: EUR\n  country: NL\n"
            f"  internal_url: {self.url}\n"
            f"http:\n  server_host: 127.0.0.1\n  server_port: {self.http_port}\n"
            f"api:\nlogger:\n  default: {self.log_level}\n" + ("frontend:\n" if self.frontend else "")
        )
        now = time.time()
        user_id, token_id, jwt_key = secrets.token_hex(16), secrets.token_hex(16), secrets.token_hex(64)
        auth = _store("auth", {
            "users": [{"id": user_id, "group_ids": ["system-admin"], "is_owner": True, "is_active": True,
                       "name": "PEEP test owner", "system_generated": False, "local_only": False}],
            "groups": [{"id": "system-admin", "name": "Administrators"}, {"id": "system-users", "name": "Users"},
                       {"id": "system-read-only", "name": "Read Only"}],
            "credentials": [],
            "refresh_tokens": [{
                "id": token_id, "user_id": user_id, "client_id": None, "client_name": "peep-lab",
                "client_icon": None, "token_type": "long_lived_access_token",
                "created_at": datetime.now(UTC).isoformat(), "access_token_expiration": _TOKEN_LIFESPAN_S,
                "token": secrets.token_hex(64), "jwt_key": jwt_key, "last_used_at": None, "last_used_ip": None,
                "expire_at": None, "credential_id": None, "version": HA_VERSION,
            }],
        })  # fmt: skip
        # Every onboarding step done: otherwise the API answers only the onboarding views.
        onboarding = _store("onboarding", {"done": ["user", "core_config", "analytics", "integration"]}, version=4)
        entries = _store("core.config_entries", {"entries": [{
            "entry_id": secrets.token_hex(16), "version": 1, "minor_version": 1, "domain": "mqtt",
            "title": str(self.mqtt["broker"]), "data": self.mqtt, "options": {}, "pref_disable_new_entities": False,
            "pref_disable_polling": False, "source": "user", "unique_id": None, "disabled_by": None,
        }]})  # fmt: skip
        for name, obj in (("auth", auth), ("onboarding", onboarding), ("core.config_entries", entries)):
            path = cfg / ".storage" / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # a password and the token's key
            with os.fdopen(fd, "w") as fh:
                json.dump(obj, fh, indent=2)
        self.token = _hs256_jwt({"iss": token_id, "iat": int(now), "exp": int(now + _TOKEN_LIFESPAN_S)}, jwt_key)

    def start(self, timeout: float = 120.0) -> Self:
        """Seed the configuration, start ``hass`` and wait until its core says RUNNING.

        The HTTP API answers while the integrations are still being set up; RUNNING is when they are. MQTT
        discovery subscribes shortly after (about a second): a test waits for an entity, never for a fixed time.

        Raises
        ------
        RuntimeError
            ``hass`` exited, or was not RUNNING within ``timeout`` s (the message ends with its log's tail).
        """
        if self.proc is not None and self.proc.poll() is None:
            return self
        self.http_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self._seed()
        # Its own TMPDIR: the MQTT integration writes the broker's CA to $TMPDIR/home-assistant-mqtt/, and an
        # instance started without one deletes that folder, pulling it from under any other Home Assistant.
        tmp = self.workdir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TMPDIR": str(tmp)}
        env.pop("PYTHONPATH", None)  # what a caller's PYTHONPATH names (the lab's sources) is not for hass to import
        # --skip-pip: the venv holds every package it needs; at test time it must never install one.
        cmd = [str(self.hass), "-c", str(self.config_dir), "--skip-pip", "--log-file", str(self._log_path)]
        with open(self.workdir / "stdout.txt", "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
        proc = self.proc
        if not wait_for(lambda: proc.poll() is not None or self._running(), timeout, step=0.2):
            self.stop(signal.SIGKILL)
            raise RuntimeError(f"Home Assistant was not RUNNING after {timeout:g} s; {self._log_tail()}")
        if proc.poll() is not None:
            self.proc = None
            raise RuntimeError(f"Home Assistant exited with {proc.returncode}; {self._log_tail()}")
        if not listens_on(proc.pid, self.http_port):  # another process took the port between choosing and binding
            self.stop()
            raise RuntimeError(f"Home Assistant did not get port {self.http_port}; {self._log_tail()}")
        return self

    def _running(self) -> bool:
        try:
            return bool(self.api("GET", "/api/config", timeout=2.0).get("state") == "RUNNING")
        except (OSError, ValueError):  # not listening yet, or an answer from a server still starting
            return False

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Send ``sig`` and wait (SIGKILL after 30 s; a SIGTERM'd Home Assistant takes 2 to 3 s to stop)."""
        stop_process(self.proc, sig, timeout=30.0)
        self.proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    @property
    def _log_path(self) -> Path:
        return self.config_dir / "hass.log"

    def log(self) -> str:
        """Home Assistant's log (``config/hass.log``) so far."""
        return self._log_path.read_text(errors="replace") if self._log_path.exists() else ""

    def _log_tail(self, chars: int = 3000) -> str:
        out = self.workdir / "stdout.txt"
        said = out.read_text(errors="replace") if out.exists() else ""
        return f"the end of {self._log_path}:\n{(self.log() or said)[-chars:]}"

    # ------------------------------------------------------------------ the REST API

    def api(self, method: str, path: str, body: Any = None, *, timeout: float = 10.0) -> Any:
        """``method path`` on the REST API with the owner's token; the decoded JSON answer (None when empty).

        Raises
        ------
        urllib.error.HTTPError
            Any status but 2xx (its ``code`` says which).
        """
        req = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

    def states(self) -> list[dict[str, Any]]:
        """Every entity's state: ``[{entity_id, state, attributes, last_changed, last_updated, context}]``."""
        return list(self.api("GET", "/api/states"))

    def state(self, entity_id: str) -> dict[str, Any] | None:
        """One entity's state (as in :meth:`states`), or None when Home Assistant has no such entity."""
        try:
            return dict(self.api("GET", f"/api/states/{entity_id}"))
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise

    def wait_state(
        self,
        entity_id: str,
        predicate: Callable[[dict[str, Any] | None], bool] = lambda s: s is not None,
        timeout: float = 15.0,
    ) -> dict[str, Any] | None:
        """Poll :meth:`state` until ``predicate(state)`` holds (by default: the entity exists); return that state.

        Raises
        ------
        TimeoutError
            It did not hold within ``timeout`` s (the message gives the last state read).
        """
        deadline = time.monotonic() + timeout
        while True:
            last = self.state(entity_id)
            if predicate(last):
                return last
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{entity_id}: not as expected after {timeout:g} s; last state {last}")
            time.sleep(0.1)

    def call_service(self, domain: str, service: str, data: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Call ``domain.service`` (``lock.lock`` with ``{"entity_id": ...}``); the states it changed."""
        return list(self.api("POST", f"/api/services/{domain}/{service}", data or {}) or [])

    # ------------------------------------------------------------------ the web page

    def screenshot(self, path: Path | str, page: str = "/config/entities", *, expect: Iterable[str] = (),
                   width: int = 1280, height: int = 800, timeout: float = 60.0) -> FrontendPage:  # fmt: skip
        """Open ``page`` of Home Assistant's web page in a headless Chromium, logged in as the owner; save a PNG.

        The login is the frontend's own stored one: ``hassTokens`` in the page's localStorage, as the frontend
        writes it after a login, holding the owner's long-lived token (valid ten years: the frontend never asks
        for a refresh). The PNG is saved once the page shows data-table rows, a row contains each of ``expect``,
        and the rows read the same twice in a row (the table renders in steps); then the icons get 0.5 s.

        Parameters
        ----------
        path : Path or str
            The PNG written (its folder is created).
        page : str
            The frontend's path: ``/config/entities`` lists every entity with its integration and status.
        expect : iterable of str
            Texts that must be in the rows before the picture is taken (an entity's name or id).
        width, height : int
            The viewport, in CSS pixels (the PNG's size: the device scale factor is 1).
        timeout : float
            The bound on the whole of it, Chromium's start excepted (selenium bounds that itself).

        Returns
        -------
        FrontendPage
            The rows and the text the page showed when saved.

        Raises
        ------
        PartUnavailable
            Chromium, its driver or selenium is missing (the message says what to install).
        RuntimeError
            Home Assistant is not running, or was started without ``frontend=True``.
        TimeoutError
            The rows did not show ``expect`` within ``timeout`` s (the message gives the address and rows read).
        """
        if not self.frontend or self.pid is None:
            raise RuntimeError("screenshot needs a running HomeAssistant(..., frontend=True)")
        driver = _chromium(width, height)
        expected = list(expect)
        try:
            driver.set_page_load_timeout(min(30.0, timeout))
            driver.set_script_timeout(10)
            # localStorage is per origin: set it from a small page of the same origin, then load the real one.
            driver.get(self.url + "/robots.txt")
            now_ms = int(time.time() * 1000)
            tokens = {"hassUrl": self.url, "clientId": self.url + "/", "access_token": self.token,
                      "token_type": "Bearer", "expires_in": int(_TOKEN_LIFESPAN_S),
                      "expires": now_ms + int(_TOKEN_LIFESPAN_S * 1000), "refresh_token": ""}  # fmt: skip
            driver.execute_script("localStorage.setItem('hassTokens', arguments[0]);", json.dumps(tokens))
            driver.get(self.url + page)
            deadline = time.monotonic() + timeout
            seen: dict[str, Any] = {}
            while True:
                read = dict(driver.execute_script(_READ_PAGE_JS))
                rows = list(read["rows"])
                ready = bool(rows) and all(any(e in r for r in rows) for e in expected)
                if ready and rows == seen.get("rows"):
                    break
                seen = read
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"{page}: rows showing {expected} not rendered after {timeout:g} s; at {read['url']} "
                        f"rows {rows}; page text {str(read['text'])[:500]!r}"
                    )
                time.sleep(0.25)
            time.sleep(0.5)  # the state icons are loaded after their rows
            read = dict(driver.execute_script(_READ_PAGE_JS))
            out = Path(path)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(driver.get_screenshot_as_png())
            return FrontendPage(url=str(read["url"]), rows=list(read["rows"]), text=str(read["text"]))
        finally:
            driver.quit()


def _chromium(width: int, height: int) -> Any:
    """A headless Chromium under selenium, its viewport ``width`` × ``height`` at scale 1, a fresh profile.

    Raises
    ------
    PartUnavailable
        Chromium, chromedriver or selenium is missing.
    """
    binary = CHROMIUM if CHROMIUM.exists() else Path(shutil.which("chromium") or CHROMIUM)
    drv = CHROMEDRIVER if CHROMEDRIVER.exists() else Path(shutil.which("chromedriver") or CHROMEDRIVER)
    if not (binary.exists() and drv.exists()):
        raise PartUnavailable(
            f"{binary} or {drv} not found: the screenshot needs Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver; scripts/bootstrap.sh installs them as root)"
        )
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError as e:
        raise PartUnavailable(f"selenium is not installed ({e}): it is in the project's dev extras") from e
    options = webdriver.ChromeOptions()
    options.binary_location = str(binary)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(drv)), options=options)
    # The window's size includes what headless Chromium keeps of a browser's frame: set the viewport itself.
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                           {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
    return driver
