"""What a trial's MLflow run holds of its evaluations: a chart's worth (at most
``evals_per_epoch`` per epoch) and always the trial's last (where it reached the target or
stopped), not every dense evaluation the engine makes near the target to resolve the objective."""

from mlflow.tracking import MlflowClient

from damptune import EvalRecord
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
