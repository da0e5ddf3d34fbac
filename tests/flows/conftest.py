"""The clean run every recovery test of tests/flows must equal (computed once a session)."""

import pytest

from flows.tune import tune
from tests.flows.grids import GRID, trials_of


@pytest.fixture(scope="session")
def clean(tmp_path_factory, scheduler, prefect_harness):
    """The same grid, never interrupted: the reference every recovery must equal."""
    run_dir = str(tmp_path_factory.mktemp("clean"))
    tune(grid_name="g", run_dir=run_dir, cluster=scheduler, **GRID)
    return trials_of(run_dir, "g")
