"""One set of defaults: the flow's parameters, the grid's settings and `damptune tune`."""

import dataclasses

from flows.cli import _TUNE_OPTIONS
from flows.tune import flow_defaults, grid_of
from tasks.grid import GridSettings


def test_flow_defaults_equal_the_grid_settings_defaults():
    flow = flow_defaults()
    settings = GridSettings()
    shared = {f.name for f in dataclasses.fields(GridSettings)} & set(flow)
    assert {"trials", "epochs", "target_accuracy", "sampler", "pruner", "mode",
            "warm_start", "eval_resolution"} <= shared
    for name in shared - {"run_dir", "storage", "tracking_uri", "checkpoint_root",
                          "max_cluster_lifetime", "data_root"}:
        assert getattr(settings, name) == flow[name], name


def test_every_tune_option_is_a_flow_parameter_and_the_defaults_validate():
    flow = flow_defaults()
    assert all(dest in flow for _, dest, _, _ in _TUNE_OPTIONS)
    settings, cells = grid_of({})
    assert len(cells) == len(flow["networks"]) * len(flow["algorithms"]) * len(flow["models"])
    assert settings.storage.startswith("sqlite:///")
