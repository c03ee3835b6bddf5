"""Fixtures for the recognition server tests: TLS material, templates, servers, PostgreSQL.

Real parts only: TLS certificates come from ``peep.lab.processes.pki`` (a real in-process CA), the
broker is the Mosquitto on 127.0.0.1:1883 (a unique topic prefix per session
keeps other test runs on the same broker out), PostgreSQL is 127.0.0.1:5432
(a private schema per test), gRPC runs over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from peep.core import features
from peep.core.release import TemplateReleaser
from peep_testing.devicemodel import calibration_path, model_keys  # noqa: F401 (fixtures)
from peep_testing.server import (
    ADMIN,
    MQTT_PREFIX,
    Pki,
    RunningServer,
    Templates,
    base_config,
    make_pki,
    mqtt_available,
    pg_admin,  # noqa: F401 (fixture)
    pg_dsn,  # noqa: F401 (fixture)
    start_server,
    tls_section,
)


@pytest.fixture(scope="session", autouse=True)
def _broker_left_clean() -> Iterator[None]:
    """Leave nothing retained on the shared broker: the servers of this session announced their bundle
    (and devices their statuses) retained under the session's own root, MQTT_PREFIX; clear them at the
    end and check that nothing is left there (a failure here names what stayed)."""
    yield
    if mqtt_available() is not None:
        return
    from peep.lab.processes.retained import clear_retained, retained_topics

    clear_retained(list(retained_topics(f"{MQTT_PREFIX}/#")))
    left = retained_topics(f"{MQTT_PREFIX}/#")
    assert not left, f"retained messages left on the broker under {MQTT_PREFIX}: {sorted(left)}"


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="session")
def templates(bundle, lfw100, lfw_background) -> Templates:
    """peep-raw ε=8 templates of lfw100 (seeded noise: simulation only) plus background people."""
    with features.enabled("seeded-noise"):
        r = TemplateReleaser(bundle, kind="peep-raw", epsilon=8.0, random_state=2024)
        X = r.release(lfw100.images)
        Xb = r.release(lfw_background.images)
    subjects = np.array([lfw100.target_names[k].replace(" ", "_") for k in lfw100.labels], dtype=object)
    rng = np.random.default_rng(7)
    train, test = [], []
    for s in np.unique(subjects):
        idx = np.flatnonzero(subjects == s)
        rng.shuffle(idx)
        k = round(0.7 * idx.size)
        train.extend(idx[:k])
        test.extend(idx[k:])
    people = np.unique(lfw_background.labels)
    rng.shuffle(people)
    bg_people = people[: people.size // 2]
    in_bg = np.isin(lfw_background.labels, bg_people)
    return Templates(
        r, bundle.bundle_id, X, subjects, np.sort(train), np.sort(test), Xb[in_bg], Xb[~in_bg],
        background_people=lfw_background.labels[in_bg],
    )  # fmt: skip


@pytest.fixture
def seeded() -> Iterator[None]:
    with features.enabled("seeded-noise"):
        yield


@pytest.fixture(scope="session")
def trained_server(
    tmp_path_factory: pytest.TempPathFactory, pki: Pki, keypair: Any, bundle_dir: Path, templates: Templates
) -> Iterator[RunningServer]:
    """A TLS server (token auth, SQLite), lfw100's 70 % enrolled through gRPC, a model trained by the Train RPC."""
    from peep.v1 import recognition_pb2

    tmp = tmp_path_factory.mktemp("trained")
    cfg = base_config(tmp, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)})
    srv = start_server(cfg, pki, tmp)
    stub = srv.stub()
    summary = stub.IngestStream(iter(templates.enrolment_messages()), metadata=ADMIN, timeout=60)
    assert summary.rejected == 0, summary.acks[0].reason if summary.acks else ""
    resp = stub.Train(recognition_pb2.TrainRequest(), metadata=ADMIN, timeout=300)
    assert resp.model_version == "v000001"
    yield srv
    srv.app.stop(0)


@pytest.fixture
def shipped_broker(tmp_path: Path, pki: Pki) -> Iterator[Any]:
    """Our own Mosquitto with the shipped configuration and ACL (device listener, server listener), killed after."""
    import signal

    from peep_testing.broker import ShippedBroker

    b = ShippedBroker(tmp_path / "broker", pki.client_ca, pki.server_cert, pki.server_key).start()
    yield b
    b.stop(signal.SIGKILL)


@pytest.fixture(scope="module", autouse=True)
def _single_threaded_blas() -> Iterator[None]:
    """The suite shares 2 cores with other jobs: multi-threaded BLAS would spin against them."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture
def fresh(tmp_path: Path, pki: Pki, keypair: Any, bundle_dir: Path) -> Iterator[RunningServer]:
    """An untrained TLS server (token auth, SQLite) with the bundle published."""
    srv = start_server(base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)}), pki, tmp_path)
    yield srv
    srv.app.stop(0)


@pytest.fixture
def keeping_all(tmp_path: Path, pki: Pki, keypair: Any, bundle_dir: Path) -> Iterator[RunningServer]:
    """As ``fresh``, with ``recognition.keep = "all"``: identify/verify templates are written after their decision
    (what relabelling a camera's templates as someone's enrolment needs)."""
    cfg = base_config(tmp_path, keypair[3], bundle_dir, grpc={"tls": tls_section(pki)}, recognition={"keep": "all"})
    srv = start_server(cfg, pki, tmp_path)
    yield srv
    srv.app.stop(0)
