"""What the test suite's parts share: servers, brokers, device models, doors, the console.

An ordinary package, importable because pytest's ``pythonpath`` (pyproject.toml) puts ``tests/lib`` on the
path: ``from peep_testing.server import start_server``.
"""
