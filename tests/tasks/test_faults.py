"""Which errors interrupt a trial (a fault of the cluster: retried) and which fail it."""

import pytest
from distributed import Client

from damptune import ConfigError
from tasks.faults import is_infrastructure_fault


def test_dasks_keyerror_for_a_worker_that_left_is_a_fault_and_a_plain_keyerror_is_not(
        scheduler):
    """A worker that leaves while the scheduler looks it up (a scatter with broadcast=True
    as the worker dies: seen when a cancelled flow run's workers went down) makes Dask raise
    a KeyError naming the worker's address. That is the cluster's fault: the trial is
    retried, not failed. Here the scheduler is asked, for real, about a worker it never had."""
    with Client(scheduler, timeout="30s") as client, pytest.raises(KeyError) as raised:
        client.scatter({"x": 1}, workers=["tcp://127.0.0.1:9"], broadcast=True)
    assert is_infrastructure_fault(raised.value)
    assert not is_infrastructure_fault(KeyError("factor"))  # a bug in the trial's own code
    assert not is_infrastructure_fault(KeyError("tcp://127.0.0.1:9 and more"))
    wrapped = ConfigError("cluster", "tcp://127.0.0.1:9", "a scheduler address")
    wrapped.__cause__ = raised.value
    assert not is_infrastructure_fault(wrapped)  # bad input stays bad input
