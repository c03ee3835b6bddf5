"""``peep demo``: the whole system on one machine (see :mod:`peep.lab.demo.runner`)."""

from peep.lab.demo.runner import Demo, DemoOptions, run_demo
from peep.lab.demo.summary import summary_lines

__all__ = ["Demo", "DemoOptions", "run_demo", "summary_lines"]
