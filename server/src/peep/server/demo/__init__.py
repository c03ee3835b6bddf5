"""``peep demo``: the whole system on one machine (see :mod:`peep.server.demo.runner`)."""

from peep.server.demo.runner import Demo, DemoOptions, run_demo
from peep.server.demo.summary import summary_lines

__all__ = ["Demo", "DemoOptions", "run_demo", "summary_lines"]
