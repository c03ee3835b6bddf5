"""``peep demo``: the whole system on one machine (see :mod:`peep.server.demo.runner`)."""

from peep.server.demo.runner import DemoOptions, run_demo, summary_lines

__all__ = ["DemoOptions", "run_demo", "summary_lines"]
