"""Typed progress records: what the engine tells its callback while it trains.

Units are in the field names or their comments: sizes in examples, ``epoch`` in passes over the
training set, ``update`` counts model updates (1 = after the first update), every ``time_*`` in
seconds. ``time_elapsed`` is measured on this machine; ``time_sim`` is the network cost model's
simulated wall-clock (:mod:`damptune.netmodel`).

The callback receives the record objects; ``TrainState.history`` (and so checkpoints and the
estimator's ``history_``) keeps them as plain dicts, ``record.as_dict()``, each with a ``kind``
key, so scikit-learn users and pandas read them as they are.

Example:
    >>> r = EvalRecord(update=3, epoch=1.0, examples_seen=96, test_loss=0.7,
    ...                test_accuracy=0.5, time_elapsed=0.2, time_sim=0.1)
    >>> record_from_dict(r.as_dict()) == r
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

__all__ = ["UpdateRecord", "EvalRecord", "ResumeRecord", "Record", "record_from_dict"]


@dataclass(frozen=True)
class _Base:
    kind: ClassVar[str]

    def as_dict(self) -> dict[str, Any]:
        """The plain-dict form kept in ``history`` (``kind`` first)."""
        return {"kind": self.kind, **dataclasses.asdict(self)}


@dataclass(frozen=True)
class UpdateRecord(_Base):
    """One model update, recorded after the optimizer step."""

    kind: ClassVar[str] = "update"
    update: int  # model updates so far, this one included
    epoch: float  # passes over the training set so far
    examples_seen: int  # examples so far, this update's batch included
    batch_size: int  # examples in this update
    lr: float  # learning rate of this update
    damping: float  # the damper's value (examples); batch_size = min(damping, cap)
    n_workers: int  # ranks that computed this update
    loss: float  # mean training loss of the batch
    grad_sq_norm: float  # squared norm of the mean gradient
    time_compute: float  # seconds of gradient computation (slowest rank, measured)
    time_comm: float  # seconds of communication (measured)
    time_update: float  # seconds of the whole update, measured
    time_elapsed: float  # measured training seconds so far
    time_sim: float  # simulated seconds so far (network profile)
    damper_examples: int = 0  # examples of the damper's own loss pass before this update
    time_damper: float = 0.0  # measured seconds of that pass (included in time_update)
    # the straggler factor of the rank this update waited for (damptune.stragglers; 1: none)
    straggle: float = 1.0
    examples_dropped: int = 0  # of batch_size, in the gradients dropped (sync "backup:B")
    # per rank, the updates its gradient's weights were behind the newest (sync "ssp:S"; ()
    # when every gradient was fresh)
    staleness: tuple[int, ...] = ()


@dataclass(frozen=True)
class EvalRecord(_Base):
    """An evaluation on the held-out set: measurement, between updates, never charged in
    ``time_elapsed`` or ``time_sim``."""

    kind: ClassVar[str] = "eval"
    update: int
    epoch: float
    examples_seen: int
    test_loss: float  # mean cross-entropy on the held-out set
    test_accuracy: float  # fraction correct, in [0, 1]
    time_elapsed: float
    time_sim: float
    best_accuracy: float = 0.0  # the best test accuracy so far, this one included


@dataclass(frozen=True)
class ResumeRecord(_Base):
    """Training continues a checkpoint: sent first, to the callback only (the history stays
    that of an unbroken run)."""

    kind: ClassVar[str] = "resume"
    update: int
    epoch: float
    examples_seen: int
    time_elapsed: float
    time_sim: float


Record = UpdateRecord | EvalRecord | ResumeRecord
_KINDS: dict[str, type[UpdateRecord] | type[EvalRecord] | type[ResumeRecord]] = {
    cls.kind: cls for cls in (UpdateRecord, EvalRecord, ResumeRecord)
}


def record_from_dict(d: dict[str, Any]) -> Record:
    """The typed record of a history dict (extra keys are ignored)."""
    cls = _KINDS[d["kind"]]
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})
