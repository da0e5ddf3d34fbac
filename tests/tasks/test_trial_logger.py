"""What a trial's MLflow run holds of its evaluations: a chart's worth (at most
``evals_per_epoch`` per epoch) and always the trial's last (where it reached the target or
stopped), not every dense evaluation the engine makes near the target to resolve the objective."""

from mlflow.tracking import MlflowClient

from damptune import EvalRecord
from damptune.records import record_from_dict
from tasks.trial_logger import MlflowTrialLogger

PER_EPOCH = 100  # updates per epoch, each one evaluated (as the engine does near the target)


def _evaluate(logger, last_update, accuracy_of):
    for u in range(1, last_update + 1):
        acc = accuracy_of(u)
        logger(EvalRecord(update=u, epoch=u / PER_EPOCH, examples_seen=32 * u, test_loss=1 - acc,
                          test_accuracy=acc, time_elapsed=u * 0.01, time_sim=u * 0.001))


def _logged(tmp_path, name, last_update, accuracy_of):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.create_experiment(name)
    parent = client.create_run(exp_id).info.run_id
    logger = MlflowTrialLogger(client, None, metrics_every=15, target=0.6, evals_per_epoch=4)
    run_id = logger.open(exp_id, parent_run_id=parent, cell_key=name, number=0,
                         params={})
    _evaluate(logger, last_update, accuracy_of)
    logger.end("FINISHED")
    history = sorted(client.get_metric_history(run_id, "test_accuracy"), key=lambda m: m.step)
    return [m.step for m in history], {m.step: m.value for m in history}


def test_a_run_logs_the_evaluation_that_reached_the_target_and_a_chart_before_it(tmp_path):
    steps, values = _logged(tmp_path, "reached", 250,
                            lambda u: 0.6 if u == 250 else min(0.59, 0.2 + u / 500))
    assert steps[-1] == 250 and values[250] == 0.6
    assert steps[0] == 1 and len(steps) <= 2.5 * 4 + 2
    assert all(b - a >= PER_EPOCH / 4 for a, b in zip(steps[:-2], steps[1:-1], strict=True))


def test_a_run_stopped_below_the_target_logs_its_last_evaluation(tmp_path):
    steps, values = _logged(tmp_path, "pruned", 237, lambda u: 0.3 + u / 10_000)
    assert steps[-1] == 237 and values[237] == 0.3 + 237 / 10_000
    assert 237 - 1 not in steps and len(steps) <= 2.37 * 4 + 2


def _counting(client):
    """Count the calls the client makes to its (real) tracking store, by method."""
    from collections import Counter

    store, calls = client._tracking_client.store, Counter()
    for name in ("search_runs", "create_run", "log_batch", "update_run_info", "log_inputs"):
        real = getattr(store, name)

        def counted(*args, _name=name, _real=real, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(store, name, counted)
    return calls


def test_a_trial_run_costs_mlflow_five_requests_and_a_rerun_reopens_it(tmp_path, blobs):
    """A new trial's run: found or created RUNNING with its tags, its params, its metrics with
    the state tag in one batch, ended; a rerun of the trial reopens the same run."""
    from damptune import TrainConfig, TrainData, train
    from tasks.results import TrialResult, TrialState

    X, y, Xt, yt = blobs
    state = train(TrainConfig(module="models.mlp:MLP", module_kwargs={
        "input_shape": (12,), "n_classes": 3, "hidden": 8}, max_epochs=1, seed=0),
        TrainData.from_arrays(X, y, Xt, yt))
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.create_experiment("requests")
    parent = client.create_run(exp_id).info.run_id
    calls = _counting(client)

    def opened():
        logger = MlflowTrialLogger(client, None, metrics_every=15, target=0.6)
        run_id = logger.open(exp_id, parent_run_id=parent, cell_key="n2/geodamp/mlp",
                             number=3, params={"factor": 2.0}, seeded_from="n1/geodamp/mlp#0")
        return logger, run_id

    logger, run_id = opened()
    assert client.get_run(run_id).info.status == "RUNNING"
    for record in state.history:
        logger(record_from_dict(record))
    logger.finish(TrialResult(3, TrialState.COMPLETE, {"factor": 2.0}, value=1.5),
                  state, {"attempts": 1, "lost_updates": 0, "lost_seconds": 0.0})
    assert dict(calls) == {"search_runs": 1, "create_run": 1, "log_batch": 2,
                           "update_run_info": 1}
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.params == {"factor": "2.0"}
    assert run.data.tags["damptune.state"] == "COMPLETE"
    assert run.data.tags["damptune.seeded_from"] == "n1/geodamp/mlp#0"
    assert run.data.metrics["objective"] == 1.5 and "test_accuracy" in run.data.metrics
    again, same = opened()
    assert same == run_id and client.get_run(run_id).info.status == "RUNNING"
    again.end("KILLED")
    assert client.get_run(run_id).info.status == "KILLED"



def test_a_reused_training_s_run_copies_its_source_s_final_metrics_or_keeps_its_own(tmp_path):
    from tasks.results import TrialResult, TrialState

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp_id = client.create_experiment("reused")
    parent = client.create_run(exp_id).info.run_id
    source = client.create_run(exp_id).info.run_id
    client.log_metric(source, "objective", 1.5, step=40)
    client.log_metric(source, "updates", 40, step=40)
    client.log_metric(source, "system/cpu_utilization_percentage", 99.0)
    result = TrialResult(3, TrialState.COMPLETE, value=1.5, reached=True, best_accuracy=0.9)
    runs = {}
    for number, from_run in ((0, source), (1, "0123456789abcdef0123456789abcdef")):  # deleted
        logger = MlflowTrialLogger(client, None, metrics_every=15, target=0.6)
        runs[number] = logger.open(exp_id, parent_run_id=parent, cell_key="c", number=number,
                                   params={})
        logger.finish_reused(result, source_run=from_run)
    copied, alone = (client.get_run(runs[n]) for n in (0, 1))
    assert copied.data.metrics == {"objective": 1.5, "updates": 40.0, "reached_target": 1.0,
                                   "best_accuracy": 0.9}
    assert copied.data.tags["damptune.reused_from"] == source
    assert alone.data.metrics == {"objective": 1.5, "reached_target": 1.0, "best_accuracy": 0.9}
    assert {r.info.status for r in (copied, alone)} == {"FINISHED"}
