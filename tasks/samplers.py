"""Wrappers that keep Optuna's GPSampler from spending a cell's budget on one point.

Optuna's GPSampler models COMPLETE trials only. A trial stopped by the bound (PRUNED: its
simulated time passed the cell's best before it reached the target) is then invisible to it,
so its next proposal is the same point, or one a rounding away, pruned again: on the default
grid's two GP runs at ``dccaab7``, MLP ``padadamp`` at n2 asked rate 0.874-0.875 for 13 of
its 16 trials, all PRUNED. :class:`PrunedSeenSampler` shows the GP each pruned trial as what
it is, a configuration at least as slow as its value so far; :class:`NoRepeatSampler` drops
an exact repeat (a trial's training is deterministic: a repeat only repeats its result).
"""

from __future__ import annotations

import copy
from collections.abc import Container
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.study._constrained_optimization import _CONSTRAINTS_KEY

from tasks.logs import run_logger

State = optuna.trial.TrialState


class _Delegating(optuna.samplers.BaseSampler):
    """``base`` in every hook; subclasses change what ``sample_relative`` returns."""

    def __init__(self, base: optuna.samplers.BaseSampler) -> None:
        self.base = base

    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: optuna.trial.FrozenTrial) -> dict[str, Any]:
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self.base.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                           param_name: str, param_distribution: BaseDistribution) -> Any:
        return self.base.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                    state: State, values: Any) -> None:
        self.base.after_trial(study, trial, state, values)


class NoRepeatSampler(_Delegating):
    """``base``, except that a joint proposal equal to the parameters of a trial the study
    already has is dropped: those parameters then come from the base's independent sampler
    (random, seeded), and the run's log says so. (Optuna's GPSampler would call that a
    "dynamic search space"; ``sampler_for`` turns its warning off.)"""

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        params = self.base.sample_relative(study, trial, search_space)
        if not params:  # the base proposes nothing (its start-up trials): nothing to compare
            return params
        same = next((t.number for t in study.get_trials(deepcopy=False)
                     if t.number != trial.number and t.params == params), None)
        if same is None:
            return params
        run_logger().info("%s trial %d: the sampler proposed %s, which trial %d already has "
                          "(its training would repeat it exactly); drawn at random instead",
                          study.study_name, trial.number, params, same)
        return {}


class PrunedSeenSampler(_Delegating):
    """``base`` (a GPSampler), shown the study's PRUNED trials that have a value as COMPLETE
    ones of that value: the objective so far where the bound stopped it, which is already
    past the best then (``tasks.objective.value_so_far``), so the model learns the point is
    no better, and a constrained model counts it feasible (its value already says it lost).
    Only the model's view changes: the study and its trials are as they were."""

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        view: Any = _PrunedAsComplete(study)
        return self.base.sample_relative(view, trial, search_space)


class _PrunedAsComplete:
    """A study as :class:`PrunedSeenSampler` shows it to its base: ``_get_trials`` (what
    Optuna's GPSampler reads) gives each PRUNED trial with a value as a COMPLETE copy; any
    other attribute is the study's own."""

    def __init__(self, study: optuna.Study) -> None:
        self._study = study

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)

    def _get_trials(self, deepcopy: bool = True, states: Container[State] | None = None,
                    use_cache: bool = False) -> list[optuna.trial.FrozenTrial]:
        trials = self._study._get_trials(deepcopy=deepcopy, states=None, use_cache=use_cache)
        constraints = {key: 0.0 for t in trials if t.state == State.COMPLETE
                       for key in t.system_attrs if key.startswith(f"{_CONSTRAINTS_KEY}:")}
        shown = [_as_complete(t, constraints) if t.state == State.PRUNED and t.values else t
                 for t in trials]
        return [t for t in shown if states is None or t.state in states]


def _as_complete(trial: optuna.trial.FrozenTrial,
                 constraints: dict[str, float]) -> optuna.trial.FrozenTrial:
    """A COMPLETE copy of a pruned ``trial``, feasible under the study's ``constraints``."""
    shown = copy.copy(trial)
    shown.state = State.COMPLETE
    shown.system_attrs = {**trial.system_attrs, **constraints}
    return shown
