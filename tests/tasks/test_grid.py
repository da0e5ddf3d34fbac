
import pytest

from damptune import ConfigError
from tasks.grid import Cell, GridSettings, cells_of
from tasks.search import distributions
from tasks.trial import objective


def grid(**kw):
    base = dict(networks=[2, 4], algorithms=["geodamp", "adadamp"], models=["mlp"])
    settings = GridSettings(**{k: kw.pop(k) for k in list(kw) if k in GridSettings().to_dict()})
    base.update(kw)
    return cells_of(settings=settings, **base)


def test_cells_are_the_product_of_the_grid():
    cells = grid()
    assert [c.key for c in cells] == ["n2/geodamp/mlp", "n2/adadamp/mlp", "n4/geodamp/mlp",
                                      "n4/adadamp/mlp"]


@pytest.mark.parametrize(("kw", "match"), [
    ({"algorithms": ["geodamp", "warpdamp"]}, r"algorithms='warpdamp'.*adadamp"),
    ({"models": ["resnet"]}, r"models='resnet'.*cnn"),
    ({"dataset": "imagenet"}, r"dataset='imagenet'.*mnist1d"),
    ({"networks": [0, 2]}, r"networks=\[0, 2\].*>= 1"),
    ({"networks": []}, r"networks=\[\]"),
    ({"trials": 0}, r"trials=0.*positive integer"),
    ({"target_accuracy": 1.5}, r"target_accuracy=1.5.*\(0, 1\]"),
    ({"target_accuracy": 0}, r"target_accuracy=0.*\(0, 1\]"),
    ({"profile": "fast"}, r"profile='fast'"),
    ({"mode": "async"}, r"mode='async'.*centralized"),
    ({"sampler": "random"}, r"sampler='random'"),
])
def test_bad_grid_parameters_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        grid(**kw)


def test_search_space_is_the_dampers_clipped_to_budget_and_cap():
    settings = GridSettings(epochs=5, per_worker_batch=32)
    geo = distributions(settings, Cell(2, "geodamp", "mlp"))
    assert set(geo) == {"factor", "delay"} and geo["delay"].high == 5
    ada = distributions(settings, Cell(2, "adadamp", "mlp"))
    assert ada["initial"].high == 64  # the cap of a 2-rank cell
    assert set(distributions(settings, Cell(2, "sgd", "mlp"))) == {"lr"}


def test_objective_is_simulated_time_to_target_or_documented_penalty():
    history = [{"kind": "update", "time_sim": 1.0},
               {"kind": "eval", "test_accuracy": 0.5, "time_sim": 1.0},
               {"kind": "update", "time_sim": 2.0},
               {"kind": "eval", "test_accuracy": 0.7, "time_sim": 2.0}]
    assert objective(history, target=0.6) == (2.0, True, 0.7)
    value, reached, best = objective(history, target=0.8)
    assert not reached and best == 0.7
    assert value == pytest.approx(2.0 * (1 + 0.1 / 0.8)) and value > 2.0


def test_cluster_from_yaml_is_opened_scaled_and_closed(tmp_path):
    from distributed import Client

    from tasks.clusters import open_cluster

    with open_cluster("infra/cluster-local.yaml", n_workers=2,
                      local_directory=str(tmp_path)) as pool:
        assert pool.size == 2
        with Client(pool.address, timeout="10s") as client:
            assert len(client.scheduler_info()["workers"]) == 2
    with pytest.raises(OSError):  # the cluster it opened is closed
        Client(pool.address, timeout="2s")


def test_unknown_cluster_source_is_refused(tmp_path):
    from tasks.clusters import open_cluster

    with pytest.raises(ConfigError, match="cluster='kubernetes'"), open_cluster(
        "kubernetes", n_workers=1, local_directory=str(tmp_path)
    ):
        pass


def _fake_cifar(directory, n=3):
    """The six CIFAR-10 python batches, tiny, in the real files' format (see models)."""
    import pickle

    import numpy as np

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{k}" for k in range(1, 6)] + ["test_batch"]:
        batch = {b"labels": [int(v) for v in rng.integers(0, 10, n)],
                 b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)}
        (directory / name).write_bytes(pickle.dumps(batch, protocol=2))
    return directory


def cifar_grid(**kw):
    return grid(dataset="cifar10", models=["wrn16_4"], **kw)


def test_cifar10_without_data_root_is_refused_naming_data_root():
    with pytest.raises(ConfigError, match=r"data_root=None.*CIFAR-10 python batches"):
        cifar_grid()


def test_cifar10_with_a_data_root_lacking_the_files_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError, match=r"data_root='/nonexistent/cifar'.*not an existing"):
        cifar_grid(data_root="/nonexistent/cifar")
    partial = _fake_cifar(tmp_path / "partial")
    (partial / "test_batch").unlink()
    with pytest.raises(ConfigError, match=r"data_root=.*partial.*lacks test_batch"):
        cifar_grid(data_root=str(partial))
    (partial / "test_batch").write_bytes(b"not a pickle")
    with pytest.raises(ConfigError, match=r"data_root=.*test_batch is not a CIFAR-10"):
        cifar_grid(data_root=str(partial))


def test_cifar10_with_the_python_batches_at_data_root_gives_the_cells(tmp_path):
    root = _fake_cifar(tmp_path / "cifar-10-batches-py")
    cells = cifar_grid(data_root=str(root))
    assert [c.key for c in cells] == ["n2/geodamp/wrn16_4", "n2/adadamp/wrn16_4",
                                      "n4/geodamp/wrn16_4", "n4/adadamp/wrn16_4"]
    assert cifar_grid(data_root=str(tmp_path))  # its parent folder is accepted too


@pytest.mark.parametrize("device", ["gpu", "cuda:0", "tpu"])
def test_a_grid_device_outside_cpu_cuda_auto_is_refused(device):
    with pytest.raises(ConfigError, match=rf"device='{device}'.*'cpu', 'cuda', 'auto'"):
        grid(device=device)


def test_the_trial_config_carries_the_grid_device():
    from models import load_dataset
    from tasks.trial import trial_config

    settings = GridSettings(device="auto")
    config = trial_config(settings, Cell(2, "geodamp", "mlp"), {"factor": 2.0, "delay": 1},
                          load_dataset("synthetic", seed=0))
    assert (config.device, config.backend, config.share_gpus) == ("auto", "auto", False)
    assert config.micro_batch_size == settings.per_worker_batch


@pytest.mark.parametrize(("pruner", "flush"), [("bound", False), ("none", False),
                                                ("hyperband", True), ("sha", True)])
def test_only_a_pruner_that_reads_reports_ends_the_ranks_segment_at_each_evaluation(
        pruner, flush):
    """Hyperband and SHA stop a trial on a report: the ranks must stop there for it, so each
    regular evaluation ends their segment. ``bound`` (the engine's simulated-time budget) and
    ``none`` read no report: evaluations travel with the segment, with fewer round trips."""
    from models import load_dataset
    from tasks.trial import trial_config

    config = trial_config(GridSettings(pruner=pruner), Cell(2, "geodamp", "mlp"),
                          {"factor": 2.0, "delay": 1}, load_dataset("synthetic", seed=0))
    assert config.eval_flush is flush
