"""A test (or a module's fixture) that configures the ``peep`` logger as a process would leaves the next test
a logger whose records ``caplog`` sees.

The tests run in this order on one worker (their group): the module's fixture and the first test leave the
logger configured, the second reads a peep record through ``caplog``, which sees nothing while ``propagate``
is False.
"""

from __future__ import annotations

import logging

import pytest

pytestmark = pytest.mark.xdist_group("logging-hygiene")


@pytest.fixture(scope="module")
def a_cli_run_in_a_modules_fixture():
    from peep.core.logs import setup_logging

    setup_logging(level="warning", fmt="text")


def test_a_cli_run_in_process_configures_the_peep_logger(a_cli_run_in_a_modules_fixture):
    from peep.core.logs import setup_logging

    setup_logging(level="warning", fmt="json")
    assert logging.getLogger("peep").propagate is False


def test_the_next_test_reads_peeps_records_through_caplog(a_cli_run_in_a_modules_fixture, caplog):
    with caplog.at_level(logging.INFO):
        logging.getLogger("peep.edge.mqtt").info("recognition_event")
    assert [r.getMessage() for r in caplog.records] == ["recognition_event"]
