"""The test broker's own start-up: a port taken between choosing it and mosquitto binding it (seen once in CI)
gets new ports on the first start; a restart keeps the ports its clients know."""

from __future__ import annotations

import signal
import socket

from peep.lab.processes.control import port_open
from peep.lab.processes.ports import free_port
from peep_testing.broker import ShippedBroker


def test_a_taken_port_is_replaced_on_the_first_start_and_kept_on_a_restart(tmp_path, pki):
    b = ShippedBroker(tmp_path / "broker", pki.client_ca, pki.server_cert, pki.server_key)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        b._listen_on(taken, free_port())
        b.start()
        try:
            assert b.dev_port != taken and port_open(b.dev_port) and port_open(b.srv_port)
            ports = (b.dev_port, b.srv_port)
            b.stop(signal.SIGTERM)
            b.start()
            assert (b.dev_port, b.srv_port) == ports
        finally:
            b.stop(signal.SIGKILL)


def test_a_chosen_port_lies_below_the_range_outgoing_connections_draw_from_in_this_workers_slot(monkeypatch):
    from peep.lab.processes import ports as cluster

    floor = cluster._ephemeral_floor()
    width = (floor - cluster._PORTS_FLOOR) // cluster._PORT_SLOTS
    for worker, slot in (("gw0", 0), ("gw3", 3)):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        ports = [free_port() for _ in range(40)]
        low = cluster._PORTS_FLOOR + slot * width
        assert all(low <= p < low + width for p in ports), (worker, ports)
        assert len(set(ports)) == len(ports)  # never the same port twice to one process
    with socket.socket() as s:  # a port in use is never chosen: the check binds it
        s.bind(("127.0.0.1", free_port()))
        held = s.getsockname()[1]
        cluster._handed_out.clear()
        assert held not in {free_port() for _ in range(200)}


def test_the_test_brokers_own_port_taken_before_its_first_start_is_replaced(tmp_path):
    from peep_testing.broker import Mosquitto

    b = Mosquitto(tmp_path / "plain", persistence=False)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", b.port))
        squatter.listen()
        taken = b.port
        b.start()
        try:
            assert b.port != taken and port_open(b.port)
            kept = b.port
            b.stop()
            b.start()
            assert b.port == kept
        finally:
            b.stop(signal.SIGKILL)
