"""PEEP lab: what measures PEEP rather than runs it -- the audit, the anonymiser, SGAP, the QBBS evaluation,
benchmarks and the soak, the scenes, the demo, and the real processes they start (:mod:`peep.lab.processes`).

Its commands join ``peep`` through the entry point group ``peep.commands`` (``lab/pyproject.toml``). The lab
imports the server and the edge agent; neither imports the lab.
"""

__version__ = "0.1.0"
