"""Bad input through every door, refused before any work with a message that names the
parameter, and nothing already written changed: the flow (Python and a deployment's
parameters reach it the same way), and ``damptune tune``."""

import contextlib
import io
import os

import pytest

from damptune import ConfigError
from damptune.cli import main as damptune
from flows.tune import tune

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

GOOD = dict(networks=[2], algorithms=["geodamp"], models=["mlp"], trials=1, epochs=1,
            target_accuracy=0.3, mode="local", cluster="local", validation_seeds=0,
            grid_name="bad")

# (parameter, bad value, words the message must contain besides the parameter's name)
ROWS = [
    ("epochs", 0, "positive number of epochs"),
    ("epochs", {"cnn": 3.0}, "missing ['mlp']"),
    ("trials", {"mlp": 0}, "positive integer (trials per cell)"),
    ("trials", {"mpl": 16}, "unknown ['mpl']"),
    ("search_margin", -0.01, "margin in [0, 1)"),
    ("search_margin", 1.0, "margin in [0, 1)"),
    ("pruner", "nope", "hyperband"),
    ("per_worker_batch", 0, "positive integer"),
    ("eval_resolution", -0.1, "fraction >= 0"),
    ("overhead_ms", -1.0, "milliseconds"),
    ("overhead_per_rank_ms", -1.0, "milliseconds"),
    ("grid_name", "", "without '/'"),
    ("grid_name", "a/b", "without '/'"),
    ("max_concurrent_cells", 0, "positive integer"),
    ("max_concurrent_trials", 0, "positive integer"),
    ("checkpoint_seconds", 0, "positive number"),
    ("checkpoint_every", -1, "0: by time only"),
    ("max_cluster_lifetime", "soon", "'6h'"),
    ("trial_attempts", 0, "tries"),
    ("worker_wait", 0, "seconds"),
    ("storage", "not a url", "SQLAlchemy"),
    ("tracking_uri", "ftp://host/x", "MLflow tracking URI"),
    ("workers_per_trial", -1, "integer >= 0"),
    ("validation_seeds", -1, "0 (no validation)"),
    ("sampler_seed", -1, "seed"),
    ("cluster", "no/such/cluster.yaml", "cluster YAML file"),
]


def _snapshot(root):
    return sorted((os.path.relpath(os.path.join(d, f), root),
                   os.stat(os.path.join(d, f)).st_mtime_ns)
                  for d, _, files in os.walk(root) for f in files)


@pytest.fixture(scope="module")
def done_grid(tmp_path_factory):
    """A finished grid whose files every refused run must leave as they are."""
    run_dir = str(tmp_path_factory.mktemp("bad") / "bad")
    tune(run_dir=run_dir, **GOOD)
    return run_dir


@pytest.mark.parametrize(("param", "value", "words"), ROWS, ids=[f"{r[0]}={r[1]!r}"
                                                                 for r in ROWS])
def test_the_flow_refuses_bad_input_naming_it_and_writes_nothing(done_grid, param, value,
                                                                   words):
    before = _snapshot(done_grid)
    with pytest.raises(ConfigError) as info:
        tune(**{**GOOD, "run_dir": done_grid, param: value})
    assert f"{param}=" in str(info.value) and words in str(info.value), str(info.value)
    assert _snapshot(done_grid) == before


def _yaml(tmp_path, text):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(("text", "words"), [
    ("kwargs: {}\n", "with 'class'"),
    ("class: no_such_module.Cluster\n", "importable Dask cluster class"),
    ("class: distributed.SpecCluster\nkwargs: {nthreads: 2}\n", "Unknown: ['nthreads']"),
])
def test_a_bad_cluster_yaml_is_refused_before_any_work(done_grid, tmp_path, text, words):
    before = _snapshot(done_grid)
    with pytest.raises(ConfigError, match="cluster=") as info:
        tune(**{**GOOD, "run_dir": done_grid, "cluster": _yaml(tmp_path, text)})
    assert words in str(info.value)
    assert _snapshot(done_grid) == before


@pytest.mark.parametrize(("flags", "words"), [
    (["--epochs", "0"], "epochs=0"),
    (["--grid-name", "a/b"], "grid_name='a/b'"),
    (["--checkpoint-every", "-1"], "checkpoint_every=-1"),
    (["--workers-per-trial", "-2"], "workers_per_trial=-2"),
    (["--validation-seeds", "-1"], "validation_seeds=-1"),
    (["--cluster", "no/such.yaml"], "cluster='no/such.yaml'"),
    (["--storage", "not a url"], "storage='not a url'"),
])
def test_damptune_tune_refuses_bad_flags_with_status_2(done_grid, flags, words):
    before = _snapshot(done_grid)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = damptune(["tune", "--networks", "2", "--algorithms", "geodamp", "--models",
                         "mlp", "--run-dir", done_grid, "--no-progress", *flags])
    assert code == 2 and words in err.getvalue(), err.getvalue()
    assert _snapshot(done_grid) == before
