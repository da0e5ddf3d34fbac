"""Bad input through every door, refused before any work with a message that names the
parameter, and nothing already written changed: the flow (Python and a deployment's
parameters reach it the same way), the ``DAMPTUNE_*`` environment variables, the cluster YAML
file, and ``damptune tune``."""

import contextlib
import hashlib
import io
import os
import subprocess
import sys

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


def _digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _snapshot(root):
    """Every file under ``root``: its path, mtime and content (byte-identical after)."""
    return sorted((os.path.relpath(os.path.join(d, f), root),
                   os.stat(os.path.join(d, f)).st_mtime_ns, _digest(os.path.join(d, f)))
                  for d, _, files in os.walk(root) for f in files)


@pytest.fixture(scope="module")
def done_grid(tmp_path_factory, scheduler):
    """A finished grid whose files every refused run must leave as they are; run with the
    DAMPTUNE_* seconds variables set empty: their defaults (on the session's cluster: a
    LocalCluster of its own would only add its start)."""
    run_dir = str(tmp_path_factory.mktemp("bad") / "bad")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DAMPTUNE_LEASE_TTL", "")
        env.setenv("DAMPTUNE_SQLITE_TIMEOUT", "")
        tune(**{**GOOD, "run_dir": run_dir, "cluster": scheduler})
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


# (variable, bad value, what is accepted)
ENV_ROWS = [
    ("DAMPTUNE_LEASE_TTL", "soon", "a positive number of seconds"),
    ("DAMPTUNE_LEASE_TTL", "0", "a positive number of seconds"),
    ("DAMPTUNE_SQLITE_TIMEOUT", "-5", "a positive number of seconds"),
    ("DAMPTUNE_SQLITE_TIMEOUT", "nan", "a positive number of seconds"),
    ("DAMPTUNE_CACHE", "/dev/null/cache", "a directory damptune can write to"),
]


@pytest.mark.parametrize(("name", "value", "accepted"), ENV_ROWS,
                         ids=[f"{r[0]}={r[1]}" for r in ENV_ROWS])
def test_the_flow_refuses_a_bad_environment_variable_naming_it_and_writes_nothing(
        done_grid, tmp_path, monkeypatch, name, value, accepted):
    """Refused at the door: the earlier grid's files as they were, a new run directory not
    made."""
    before = _snapshot(done_grid)
    monkeypatch.setenv(name, value)
    for run_dir in (done_grid, str(tmp_path / "new")):
        with pytest.raises(ConfigError) as info:
            tune(**{**GOOD, "run_dir": run_dir})
        assert f"{name}={value!r}" in str(info.value) and accepted in str(info.value), (
            str(info.value))
    assert _snapshot(done_grid) == before
    assert not os.path.exists(tmp_path / "new")


def _yaml(tmp_path, text):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    return str(path)


# (the file's text, what is wrong, what is accepted): each named in the message
YAML_ROWS = [
    ("kwargs: {}\n", "no 'class'", "with 'class'"),
    ("class: [unclosed\n", "YAML syntax error at line 2", "a YAML mapping"),
    ("- distributed.LocalCluster\n", "a list, not a mapping", "a YAML mapping"),
    ("class: no_such_module.Cluster\n", "'no_such_module.Cluster'",
     "importable Dask cluster class"),
    ("class: collections.OrderedDict\n", "'collections.OrderedDict' is not one",
     "a Dask cluster class"),
    ("class: distributed.SpecCluster\nkwargs: {nthreads: 2}\n", "Unknown: ['nthreads']",
     "'kwargs' that distributed.SpecCluster takes"),
    # passed on by LocalCluster to its workers: each would fail to start, with a traceback
    ("class: distributed.LocalCluster\nkwargs: {n_wrkers: 2}\n", "Unknown: ['n_wrkers']",
     "passes on to distributed.nanny.Nanny"),
    ("class: distributed.deploy.SpecCluster\n"
     "kwargs: {worker: {cls: distributed.Nanny, options: {nthread: 1}}}\n",
     "Unknown: ['nthread']", "'kwargs.worker.options' that distributed.Nanny takes"),
    ("class: distributed.LocalCluster\nkwarg: {n_workers: 2}\n", "Unknown: ['kwarg']",
     "no key but ['class', 'kwargs', 'workers']"),
    ("class: distributed.LocalCluster\nworkers: many\n", "It is 'many'", "'workers' null"),
]


@pytest.mark.parametrize(("text", "wrong", "accepted"), YAML_ROWS,
                         ids=[r[1] for r in YAML_ROWS])
def test_a_bad_cluster_yaml_is_refused_before_any_work(done_grid, tmp_path, text, wrong,
                                                       accepted):
    before = _snapshot(done_grid)
    path = _yaml(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        tune(**{**GOOD, "run_dir": done_grid, "cluster": path})
    message = str(info.value)
    assert f"cluster={path!r}" in message, message  # the file
    assert wrong in message and accepted in message, message
    assert _snapshot(done_grid) == before


@pytest.mark.parametrize(("flags", "env", "words"), [
    (["--epochs", "0"], {}, "epochs=0"),
    (["--grid-name", "a/b"], {}, "grid_name='a/b'"),
    (["--checkpoint-every", "-1"], {}, "checkpoint_every=-1"),
    (["--workers-per-trial", "-2"], {}, "workers_per_trial=-2"),
    (["--validation-seeds", "-1"], {}, "validation_seeds=-1"),
    (["--cluster", "no/such.yaml"], {}, "cluster='no/such.yaml'"),
    (["--storage", "not a url"], {}, "storage='not a url'"),
    ([], {"DAMPTUNE_LEASE_TTL": "1m"}, "DAMPTUNE_LEASE_TTL='1m' is not accepted; expected a "
     "positive number of seconds"),
    ([], {"DAMPTUNE_SQLITE_TIMEOUT": "-1"}, "DAMPTUNE_SQLITE_TIMEOUT='-1' is not accepted; "
     "expected a positive number of seconds"),
])
def test_damptune_tune_refuses_bad_flags_with_status_2(done_grid, monkeypatch, flags, env,
                                                      words):
    before = _snapshot(done_grid)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = damptune(["tune", "--networks", "2", "--algorithms", "geodamp", "--models",
                         "mlp", "--run-dir", done_grid, "--no-progress", *flags])
    assert code == 2 and words in err.getvalue(), err.getvalue()
    assert "Traceback" not in err.getvalue(), err.getvalue()
    assert _snapshot(done_grid) == before


def test_damptune_tune_refuses_a_keyword_its_cluster_passes_to_its_workers(tmp_path):
    """`damptune tune --cluster x.yaml` whose LocalCluster kwargs hold a misspelt worker
    keyword: once, the workers failed to start, the terminal filled with the nannies'
    tracebacks and the run exited 1 with its run directory written. Now: status 2, a clear
    line naming the file and the keyword, no traceback, and the default run directory
    (runs/grid under the working directory) not made."""
    path = _yaml(tmp_path, "class: distributed.LocalCluster\nkwargs: {n_wrkers: 2}\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    out = subprocess.run([sys.executable, "-m", "damptune", "tune", "--networks", "2",
                          "--algorithms", "geodamp", "--models", "mlp", "--no-progress",
                          "--cluster", path], capture_output=True, text=True, cwd=cwd,
                         timeout=300)
    assert out.returncode == 2, (out.returncode, out.stderr[-3000:])
    assert (f"damptune tune: error: cluster={path!r} is not accepted" in out.stderr
            and "Unknown: ['n_wrkers']" in out.stderr), out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-3000:]
    assert list(cwd.iterdir()) == []
