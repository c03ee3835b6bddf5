"""The real processes the lab and the tests start, one way for all of them.

:mod:`~peep.lab.processes.control`
    waiting, stopping (a signal, then SIGKILL), ports open, ``/proc`` readings, a shipped unit's environment
:mod:`~peep.lab.processes.ports`
    free loopback ports and whether a process listens on one
:mod:`~peep.lab.processes.mosquitto`
    Mosquitto with the shipped configuration (:class:`~peep.lab.processes.mosquitto.ShippedMosquitto`) and a
    bare one of the caller's configuration (:class:`~peep.lab.processes.mosquitto.Mosquitto`)
:mod:`~peep.lab.processes.postgres`
    a PostgreSQL cluster of a run's own
:mod:`~peep.lab.processes.replica`
    ``peep serve`` as a subprocess, its JSON log collected
:mod:`~peep.lab.processes.haproxy`, :mod:`~peep.lab.processes.sockets`
    HAProxy with the shipped configuration, and the short socket folders it needs
:mod:`~peep.lab.processes.tcpproxy`
    a cuttable network path
:mod:`~peep.lab.processes.pki`
    a throw-away TLS authority
:mod:`~peep.lab.processes.retained`
    listing and clearing what a run leaves retained on a broker

The benchmarks, the soak, the demo and the tests use these; none keeps a copy of its own.
"""
