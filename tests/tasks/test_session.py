"""A flow run's session on a real Dask cluster: while trials train on the workers, the flow's
process keeps to one torch thread (its samplers' GP fits must not take the workers' cores),
and gives the process its threads back when the session closes."""

import pytest
import torch

from tasks.grid import GridSettings
from tasks.session import open_session

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode, inside", [("centralized", 1), ("local", None)])
def test_the_flow_process_keeps_one_torch_thread_while_workers_train(
        scheduler, tmp_path, mode, inside):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        settings = GridSettings(mode=mode, run_dir=str(tmp_path),
                                storage=f"sqlite:///{tmp_path}/optuna.db",
                                tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
        with open_session(settings, key="k", cluster=scheduler, n_workers=1):
            assert torch.get_num_threads() == (inside or 2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
