"""The test broker's own start-up: a port taken between choosing it and mosquitto binding it (seen once in CI)
gets new ports on the first start; a restart keeps the ports its clients know."""

from __future__ import annotations

import signal
import socket

from peep.server.bench.cluster import free_port
from peep.server.bench.soak.parts import port_open
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
