"""The QBBS evaluation and its experiments: the hosted module (:mod:`peep.server.qbbs`) on simulated people."""
