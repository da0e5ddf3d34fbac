import numpy as np
import pytest
from sklearn.base import clone

from damptune import ConfigError, DampedClassifier, StopTraining
from damptune.dampers import GeoDamp
from damptune.records import EvalRecord
from models import MLP


def make(**kw):
    base = dict(module=MLP, module__hidden=32, optimizer__momentum=0.9, lr=0.05,
                batch_size="geodamp", batch_size__initial=16, batch_size__factor=2,
                batch_size__delay=1, max_batch_size=64, max_epochs=3, mode="local")
    base.update(kw)
    return DampedClassifier(**base)


def test_estimator_fit_predict_score(blobs):
    X, y, Xt, yt = blobs
    clf = make().fit(X, y, eval_set=(Xt, yt))
    assert clf.score(Xt, yt) > 0.9
    assert clf.predict(Xt[:5]).shape == (5,)
    assert np.allclose(clf.predict_proba(Xt[:5]).sum(1), 1)
    assert clf.n_updates_ == len([r for r in clf.history_ if r["kind"] == "update"])
    assert {r["batch_size"] for r in clf.history_ if r["kind"] == "update"} == {16, 32, 64}


def test_estimator_keeps_original_labels(blobs):
    X, y, _, _ = blobs
    labels = np.array(["a", "b", "c"])[y]
    clf = make(max_epochs=2).fit(X, labels)
    assert set(clf.predict(X)) <= {"a", "b", "c"}
    assert clf.score(X, labels) > 0.9


def test_estimator_params_clone_and_nested_set_params():
    clf = make()
    params = clf.get_params()
    assert params["module__hidden"] == 32 and params["batch_size__factor"] == 2
    twin = clone(clf)
    assert twin.get_params() == params
    twin.set_params(batch_size=GeoDamp, batch_size__factor=5, lr=0.1)
    assert twin.batch_size is GeoDamp and twin.batch_size__factor == 5 and twin.lr == 0.1
    assert clf.batch_size__factor == 2


def test_damper_instance_and_int_batch_size(blobs):
    X, y, _, _ = blobs
    clf = DampedClassifier(module=MLP, batch_size=GeoDamp(initial=8, factor=4, delay=1),
                           max_batch_size=64, max_epochs=2).fit(X, y)
    assert {r["batch_size"] for r in clf.history_ if r["kind"] == "update"} == {8, 32}
    # nested parameters override the instance's
    clf = make(batch_size=GeoDamp(initial=8, factor=4, delay=1), batch_size__initial=8,
               max_epochs=2).fit(X, y)
    assert {r["batch_size"] for r in clf.history_ if r["kind"] == "update"} == {8, 16}
    clf = DampedClassifier(module=MLP, batch_size=24, max_epochs=1).fit(X, y)
    assert {r["batch_size"] for r in clf.history_ if r["kind"] == "update"} == {24}
    with pytest.raises(ConfigError, match=r"batch_size__\*=\['delay', 'factor'.*SGD"):
        make(batch_size=24).fit(X, y)


def test_partial_fit_continues_one_epoch(blobs):
    X, y, _, _ = blobs
    clf = make(max_epochs=1).fit(X, y)
    seen = clf.examples_seen_
    clf.partial_fit(X, y)
    assert clf.examples_seen_ >= 2 * seen - 64 and clf.state_.epoch >= 2


def test_callback_receives_records_and_can_stop(blobs):
    X, y, Xt, yt = blobs
    seen = []

    def callback(record):
        seen.append(record)
        if isinstance(record, EvalRecord):
            raise StopTraining("pruned at the first evaluation")

    clf = make(callback=callback).fit(X, y, eval_set=(Xt, yt))
    assert clf.stopped_ == "pruned at the first evaluation"
    assert isinstance(seen[-1], EvalRecord) and seen[-1].epoch == pytest.approx(1, abs=0.1)
    assert [r.as_dict() for r in seen] == clf.history_


def test_callback_can_stop_decentralized(blobs, scheduler):
    X, y, Xt, yt = blobs

    def callback(record):
        if isinstance(record, EvalRecord):
            raise StopTraining("enough")

    clf = make(mode="decentralized", cluster=scheduler, per_worker_batch=16, max_workers=4,
               callback=callback).fit(X, y, eval_set=(Xt, yt))
    assert clf.stopped_ == "enough"
    assert clf.state_.epoch < 1.2
    assert clf.score(Xt, yt) > 0.5


def _fit_on(scheduler, blobs, processes):
    """A centralized fit of up to 4 ranks on ``processes`` workers, and the workers its Dask
    tasks ran on (the scheduler's record)."""
    from distributed import Client, get_task_stream

    X, y, Xt, yt = blobs
    with Client(scheduler, set_as_default=False) as client, get_task_stream(client) as stream:
        clf = make(mode="centralized", cluster=scheduler, per_worker_batch=16, max_workers=4,
                   processes=processes, compute_per_example=1e-5,  # one calibration for both
                   ).fit(X, y, eval_set=(Xt, yt))
    return clf, {t["worker"] for t in stream.data if t.get("worker")}


def test_processes_run_p_ranks_on_fewer_workers_with_the_same_math(blobs, scheduler):
    every, ran_every = _fit_on(scheduler, blobs, None)
    one, ran_one = _fit_on(scheduler, blobs, 1)
    assert len(ran_every) == 4 and len(ran_one) == 1
    sizes = [(r["batch_size"], r["n_workers"]) for r in one.history_ if r["kind"] == "update"]
    assert max(p for _, p in sizes) == 4  # four ranks' shares, on one worker
    assert sizes == [(r["batch_size"], r["n_workers"]) for r in every.history_
                     if r["kind"] == "update"]
    assert one.state_.time_sim == every.state_.time_sim
    evals = [[r["test_accuracy"] for r in clf.history_ if r["kind"] == "eval"]
             for clf in (one, every)]
    assert evals[0] == pytest.approx(evals[1], abs=1e-6)


@pytest.mark.parametrize(("kw", "match"), [
    ({"processes": 0, "mode": "centralized"}, r"processes=0.*integer >= 1"),
    ({"processes": 2, "mode": "decentralized", "max_workers": 4},
     r"processes=2.*at least max_workers \(4\)"),
])
def test_bad_processes_fail_naming_it(blobs, scheduler, kw, match):
    X, y, _, _ = blobs
    with pytest.raises(ConfigError, match=match):
        make(cluster=scheduler, per_worker_batch=16, **kw).fit(X, y)


@pytest.mark.parametrize(("kw", "match"), [
    ({"batch_size": "nope"}, r"batch_size='nope'.*geodamp"),
    ({"mode": "parallel"}, r"mode='parallel'.*centralized"),
    ({"max_batch_size": 8}, r"max_batch_size=8.*batch_size__initial=16"),
    ({"per_worker_batch": 0}, r"per_worker_batch=0.*positive integer"),
    ({"max_epochs": -1}, r"max_epochs=-1.*positive number"),
    ({"min_workers": 5, "max_workers": 2}, r"min_workers=5.*max_workers=2"),
    ({"batch_size__factor": -3}, r"batch_size__factor=-3"),
    ({"eval_flush": "no"}, r"eval_flush='no'.*True or False"),
])
def test_bad_parameters_fail_before_work(blobs, kw, match):
    X, y, _, _ = blobs
    calls = []
    with pytest.raises(ConfigError, match=match):
        make(callback=calls.append, **kw).fit(X, y)
    assert calls == []


def test_unknown_nested_prefix_is_refused():
    with pytest.raises(ConfigError, match="modul__hidden"):
        make(modul__hidden=3)
