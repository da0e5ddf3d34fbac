"""When a trial's schedule first changed its batch size or learning rate, and what the answer
says of a configuration that reached the target before its schedule did (it trained as plain
SGD): real local-mode training runs, then the report's text from answer rows."""

import pytest

from damptune import TrainConfig, TrainData, train
from damptune.config import import_path
from models import load_dataset, model_class
from tasks.answer import answer_markdown
from tasks.objective import first_change_epoch
from tasks.stats import answer_rows


@pytest.fixture(scope="module")
def data():
    ds = load_dataset("mnist1d", seed=0)
    return ds, TrainData.from_arrays(ds.X_train, ds.y_train, ds.X_test, ds.y_test)


def _history(data, damper, **kwargs):
    ds, train_data = data
    config = TrainConfig(
        module=import_path(model_class("mlp")),
        module_kwargs={"input_shape": tuple(ds.input_shape), "n_classes": int(ds.n_classes)},
        optimizer_kwargs={"momentum": 0.9}, lr=0.05, damper=damper,
        damper_kwargs={"initial": 32, **kwargs}, max_batch_size=128, per_worker_batch=128,
        max_workers=1, max_epochs=2.5, eval_every=1.0, seed=0, mode="local")
    return train(config, train_data).history


@pytest.mark.parametrize("damper", ["geodamp", "geodamplr"])
def test_a_step_schedule_first_changes_just_after_its_delay(data, damper):
    history = _history(data, damper, factor=2.0, delay=1)
    epoch, n = first_change_epoch(history), len(data[0].y_train)
    assert epoch is not None
    # the first changed update began within one batch of 32 after epoch 1 (the delay)
    changed = next(r for r in history if r["kind"] == "update" and r["epoch"] == epoch)
    assert 1.0 - 1e-9 <= epoch - changed["batch_size"] / n < 1.0 + 32 / n
    first = next(r for r in history if r["kind"] == "update")
    before = [r for r in history if r["kind"] == "update" and r["epoch"] < epoch]
    assert before and all((r["batch_size"], r["lr"]) == (first["batch_size"], first["lr"])
                          for r in before)


@pytest.mark.parametrize("damper, kwargs", [("geodamp", {"factor": 2.0, "delay": 3}),
                                            ("sgd", {})])
def test_a_schedule_that_never_acts_within_the_training_has_no_change(data, damper, kwargs):
    assert first_change_epoch(_history(data, damper, **kwargs)) is None


def test_padadamp_changes_its_batch_from_its_first_updates(data):
    epoch = first_change_epoch(_history(data, "padadamp", rate=1.0))
    assert epoch is not None and epoch < 0.05


def _row(algorithm, values, unchanged, params):
    return {"network": 4, "model": "cnn", "algorithm": algorithm, "study": algorithm,
            "values": values, "reached": {s: True for s in values}, "params": params,
            "validates": "", "n_seeds": len(values), "replaced": [], "retrained": 1,
            "unchanged_seeds": unchanged}


def test_the_answer_says_when_the_baseline_trained_as_plain_sgd():
    seeds = range(6)
    rows = [_row("geodamplr", {s: 1.3 + 0.01 * s for s in seeds}, 5, {"factor": 7.6,
                                                                         "delay": 8}),
            _row("geodamp-matched", {s: 1.3 + 0.01 * s for s in seeds}, 6, {"factor": 7.6,
                                                                               "delay": 8}),
            _row("padadamp", {s: 0.9 + 0.01 * s for s in seeds}, 0, {"rate": 0.1})]
    text = answer_markdown(answer_rows(rows, baseline="geodamplr"))
    assert ("geodamplr's configuration (factor=7.6, delay=8) stopped before its schedule "
            "changed the batch size or learning rate on 5 of 6 held-out seeds") in text
    assert "the baseline's search found no decay" in text
    assert "geodamp-matched's" not in text and "padadamp's" not in text
    rows.append(_row("sgd", {s: 1.4 for s in seeds}, 6, {"lr": 0.05}))  # it has no schedule
    assert "sgd's" not in answer_markdown(answer_rows(rows, baseline="geodamplr"))
    # on half the seeds or fewer, or unknown (a grid from before it was recorded): no sentence
    for unchanged in (3, None):
        rows[0]["unchanged_seeds"] = unchanged
        text = answer_markdown(answer_rows(rows, baseline="geodamplr"))
        assert "plain SGD" not in text
