"""Warm start across cells: which neighbours seed a cell, what is enqueued, and only once."""

import optuna
from optuna.distributions import FloatDistribution, IntDistribution

from tasks.grid import Cell
from tasks.warmstart import SEEDED_FROM, neighbours, seed_study, seeds_of

CELLS = [Cell(n, a, m) for n in (2, 4, 8) for a in ("geodamp", "padadamp") for m in ("mlp", "cnn")]
SPACE = {"factor": FloatDistribution(1.5, 10.0, log=True), "delay": IntDistribution(1, 6)}


def test_neighbours_are_the_nearest_smaller_network_and_the_models_before():
    assert neighbours(Cell(2, "geodamp", "mlp"), CELLS) == []
    assert neighbours(Cell(2, "geodamp", "cnn"), CELLS) == [Cell(2, "geodamp", "mlp")]
    assert neighbours(Cell(8, "padadamp", "cnn"), CELLS) == [
        Cell(4, "padadamp", "cnn"), Cell(8, "padadamp", "mlp")]
    # every neighbour comes earlier in the grid's order: it can finish first
    assert all(CELLS.index(n) < CELLS.index(c) for c in CELLS for n in neighbours(c, CELLS))


def study_with(values_params, name):
    study = optuna.create_study(study_name=name, direction="minimize")
    for value, params in values_params:
        study.add_trial(optuna.trial.create_trial(params=params, distributions={
            "factor": FloatDistribution(1.5, 10.0, log=True),
            "delay": IntDistribution(1, 60)}, value=value))
    return study


def test_seeds_are_each_neighbours_best_clipped_to_this_space():
    a = study_with([(3.0, {"factor": 2.0, "delay": 3}), (2.0, {"factor": 4.0, "delay": 40})],
                   "a")
    b = study_with([(5.0, {"factor": 3.0, "delay": 2})], "b")
    empty = optuna.create_study(study_name="e")
    seeds = seeds_of([(Cell(2, "geodamp", "mlp"), a), (Cell(4, "geodamp", "cnn"), b),
                      (Cell(2, "geodamp", "cnn"), empty)], SPACE)
    assert seeds == [("n2/geodamp/mlp#1", {"factor": 4.0, "delay": 6}),  # delay 40 clipped
                     ("n4/geodamp/cnn#0", {"factor": 3.0, "delay": 2})]


def test_a_neighbours_faster_near_miss_is_tried_beside_its_best():
    """A neighbour whose best reached the target slowly, and whose faster trial stopped 0.01
    short of it on the search's seed, seeds both; a farther miss (0.1 short) and a slower
    near miss seed nothing."""
    from tasks.search import TARGET_CONSTRAINT

    study = optuna.create_study(study_name="n", direction="minimize")
    for value, short, factor in ((3.0, 0.0, 2.0), (4.0, 0.01, 5.0), (1.0, 0.01, 3.0),
                                 (0.5, 0.1, 9.0), (1.5, 0.015, 4.0)):
        study.add_trial(optuna.trial.create_trial(
            params={"factor": factor, "delay": 3}, distributions=SPACE, value=value,
            constraints={TARGET_CONSTRAINT: short}))
    assert seeds_of([(Cell(2, "geodamp", "mlp"), study)], SPACE) == [
        ("n2/geodamp/mlp#0", {"factor": 2.0, "delay": 3}),
        ("n2/geodamp/mlp#2", {"factor": 3.0, "delay": 3})]


def test_seed_study_enqueues_once_and_a_rerun_finishes_a_halfway_seeding(tmp_path):
    storage = f"sqlite:///{tmp_path}/s.db"
    seeds = [("n2/geodamp/mlp#1", {"factor": 4.0, "delay": 6}),
             ("n4/geodamp/cnn#0", {"factor": 3.0, "delay": 2})]
    study = optuna.create_study(study_name="c", storage=storage)
    study.enqueue_trial(seeds[0][1], user_attrs={SEEDED_FROM: seeds[0][0]})  # killed here
    assert seed_study(study, seeds) == 1  # the rest
    assert seed_study(study, seeds) == 0  # never twice
    asked = [study.ask(SPACE) for _ in range(2)]
    assert [t.params for t in asked] == [s[1] for s in seeds]
    assert [study.trials[t.number].user_attrs[SEEDED_FROM] for t in asked] == [s[0] for s in seeds]
    fresh = optuna.create_study(study_name="d", storage=storage)
    fresh.ask(SPACE)  # a study that started unseeded stays so
    assert seed_study(fresh, seeds) == 0 and len(fresh.trials) == 1
