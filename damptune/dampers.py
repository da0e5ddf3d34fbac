"""Dampers: turn training progress into the next batch size (and learning rate).

A damper computes a *damping* ``d`` (an integer number of examples) before every model update.
The cap-then-decay rule, shared by all dampers, turns it into the update's batch size and
learning rate::

    batch_size = min(d, cap)
    lr         = lr0                 if d <= cap
                 lr0 * cap / d       otherwise

so the gradient-noise scale ``batch_size / lr`` always equals ``d / lr0``. The cap is
``max_batch_size`` (``P × per_worker_batch`` for a cluster of P ranks), except for the
learning-rate-only dampers (``geodamplr``, ``cntsdamplr``) whose cap is their initial batch size:
their damping turns entirely into learning-rate decay.

``dwell``: the damping is recomputed only every ``dwell`` updates and held in between.

Example:
    >>> from damptune.dampers import GeoDamp, Progress
    >>> d = GeoDamp(initial=4, factor=2, delay=3)
    >>> [d.step(Progress(update=0, epoch=e), lr0=1.0, max_batch_size=8).lr for e in (0, 3, 6)]
    [1.0, 1.0, 0.5]
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Self, cast

from damptune.errors import ConfigError
from damptune.imports import import_path, resolve
from damptune.validate import positive_int

__all__ = [
    "Param",
    "Progress",
    "Step",
    "Damper",
    "SGD",
    "GeoDampLR",
    "CntsDampLR",
    "GeoDamp",
    "PadaDamp",
    "AdaDamp",
    "RadaDamp",
    "DAMPERS",
    "get_damper",
    "spec_of",
]

_EPS = 1e-9  # guards ceil() against float fuzz such as 4 * 2**2 = 16.000000000000004


@dataclass(frozen=True)
class Param:
    """One tunable hyperparameter of a damper: a search-space entry for the tuner.

    ``unit`` says what the number counts (``"epochs"``, ``"updates"``, ``"examples"``,
    ``"examples/update"``, ``""`` for a pure ratio).
    """

    name: str
    low: float
    high: float
    log: bool = False
    integer: bool = False
    unit: str = ""
    doc: str = ""


@dataclass
class Progress:
    """What a damper sees before update ``update`` (``update`` updates are done so far).

    ``loss`` and ``grad_sq_norm`` are those of the previous update's batch (None before the
    first); ``train_loss`` evaluates F(w) on a fixed training subset when called (AdaDamp).
    """

    update: int
    epoch: float = 0.0
    examples_seen: int = 0
    loss: float | None = None
    grad_sq_norm: float | None = None
    train_loss: Callable[[], float] | None = None


@dataclass(frozen=True)
class Step:
    """The batch size (examples), learning rate and damping (examples) of one update."""

    damping: int
    batch_size: int
    lr: float


class Damper:
    """Base class. Subclasses implement :meth:`raw_damping` and declare ``search_space``.

    Its hyperparameters are its constructor's keyword arguments, kept as attributes of the same
    names: :meth:`get_params` and :meth:`set_params` follow scikit-learn's protocol (``clone``
    works), without importing scikit-learn (~1.5 s of CPU in every process that trains).

    Args:
        initial: initial batch size B0, in examples.
        dwell: recompute the damping only every ``dwell`` updates.
    """

    name: ClassVar[str] = ""
    lr_only: ClassVar[bool] = False
    # the damper needs the squared norm of each update's gradient (charged in simulated time)
    uses_grad_norm: ClassVar[bool] = False
    search_space: ClassVar[tuple[Param, ...]] = ()

    def __init__(self, *, initial: int = 32, dwell: int = 1) -> None:
        self.initial = initial
        self.dwell = dwell

    # -- scikit-learn's parameter protocol -------------------------------------------------
    @classmethod
    def _param_names(cls) -> list[str]:
        signature = inspect.signature(cls.__init__)
        return sorted(p.name for p in signature.parameters.values()
                      if p.name != "self" and p.kind is not p.VAR_KEYWORD)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The hyperparameters, by name (``deep`` is accepted: a damper has no sub-objects)."""
        return {name: getattr(self, name) for name in self._param_names()}

    def set_params(self, **params: Any) -> Self:
        """Set hyperparameters by name; an unknown name is a ``ValueError``, as in sklearn."""
        unknown = sorted(set(params) - set(self._param_names()))
        if unknown:
            raise ValueError(f"invalid parameters {unknown} for {type(self).__name__}: "
                             f"valid parameters are {self._param_names()}")
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"

    # -- the rule ---------------------------------------------------------------------------
    def raw_damping(self, progress: Progress) -> float:
        """The damping before rounding; subclasses override."""
        raise NotImplementedError

    def damping(self, progress: Progress) -> int:
        """The damping (examples) for this update, recomputed every ``dwell`` updates."""
        self._check()
        cached = getattr(self, "cached_", None)
        if cached is None or progress.update % self.dwell == 0:
            raw = self.raw_damping(progress)
            self.cached_ = max(1, math.ceil(raw - _EPS))
        return int(self.cached_)

    def step(self, progress: Progress, *, lr0: float, max_batch_size: int) -> Step:
        """Batch size and learning rate of the next update by the cap-then-decay rule."""
        d = self.damping(progress)
        cap = int(self.initial) if self.lr_only else int(max_batch_size)
        if d <= cap:
            return Step(damping=d, batch_size=d, lr=float(lr0))
        return Step(damping=d, batch_size=cap, lr=float(lr0) * cap / d)

    def observe(self, *, loss: float, grad_sq_norm: float) -> None:  # noqa: B027
        """Called after every update with its batch loss and squared gradient norm."""

    # -- checkpointing ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything that changes during training (fitted attributes ending in ``_``)."""
        return {k: v for k, v in vars(self).items() if k.endswith("_")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned; the hyperparameters are not touched."""
        for key in [k for k in vars(self) if k.endswith("_")]:
            delattr(self, key)
        for key, value in state.items():
            setattr(self, key, value)

    # -- validation -------------------------------------------------------------------------
    @classmethod
    def space(cls, *, max_epochs: float | None = None) -> tuple[Param, ...]:
        """The search space; ranges in epochs are clipped to ``max_epochs`` when given."""
        out = []
        for p in cls.search_space:
            if max_epochs is not None and p.unit == "epochs" and p.high > max_epochs:
                high = max(p.low, float(math.floor(max_epochs)) if p.integer else max_epochs)
                p = Param(p.name, p.low, high, p.log, p.integer, p.unit, p.doc)
            out.append(p)
        return tuple(out)

    def _check(self) -> None:
        if getattr(self, "checked_", False):
            return
        positive_int("batch_size__initial", self.initial)
        positive_int("batch_size__dwell", self.dwell)
        for p in self.search_space:
            value = getattr(self, p.name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
                raise ConfigError(
                    f"batch_size__{p.name}", value, f"a positive number (search range {p.low}…"
                    f"{p.high} {p.unit})".rstrip(),
                )
        self.validate()
        self.checked_ = True

    def validate(self) -> None:  # noqa: B027
        """Extra checks of the hyperparameters; raise ConfigError."""


class SGD(Damper):
    """Constant batch size B0, constant learning rate: the baseline."""

    name = "sgd"

    def raw_damping(self, progress: Progress) -> float:
        return float(self.initial)


class GeoDamp(Damper):
    """Geometric damping: ``d = B0 · factor^⌊epoch / delay⌋``.

    Args:
        factor: growth factor of the damping every ``delay`` epochs.
        delay: epochs between growth steps.
    """

    name = "geodamp"
    search_space = (
        Param("factor", 1.5, 10.0, log=True, doc="damping growth per step"),
        # log scale: a delay at or past the epoch where the target is reached never acts
        # (one trajectory), and on a linear scale those delays took up to half the searches
        Param("delay", 1, 60, log=True, integer=True, unit="epochs", doc="epochs between steps"),
    )

    def __init__(
        self, *, initial: int = 32, dwell: int = 1, factor: float = 2.0, delay: float = 10
    ) -> None:
        super().__init__(initial=initial, dwell=dwell)
        self.factor = factor
        self.delay = delay

    def validate(self) -> None:
        if self.factor < 1:
            raise ConfigError("batch_size__factor", self.factor, "a number >= 1")

    def raw_damping(self, progress: Progress) -> float:
        steps = math.floor(progress.epoch / self.delay + _EPS)
        return self.initial * self.factor**steps


class GeoDampLR(GeoDamp):
    """Step learning-rate decay ``lr = lr0 / factor^⌊epoch / delay⌋`` at constant batch B0.

    The damping grows as in :class:`GeoDamp`, but the cap is B0, so it is all LR decay.
    """

    name = "geodamplr"
    lr_only = True


class PadaDamp(Damper):
    """Linear damping in updates: ``d = ⌈B0 + rate · k⌉``.

    Args:
        rate: examples added to the damping per model update.
    """

    name = "padadamp"
    search_space = (
        Param("rate", 0.01, 10.0, log=True, unit="examples/update", doc="damping growth"),
    )

    def __init__(self, *, initial: int = 32, dwell: int = 1, rate: float = 1.0) -> None:
        super().__init__(initial=initial, dwell=dwell)
        self.rate = rate

    def raw_damping(self, progress: Progress) -> float:
        return self.initial + self.rate * progress.update


class CntsDampLR(Damper):
    """Continuous LR decay at constant batch B0: ``lr = lr0 · B0 / (B0 + 1 + c·(k+1))``.

    Its damping is ``B0 + 1 + c·(k+1)`` with cap B0, which gives exactly that learning rate.
    """

    name = "cntsdamplr"
    lr_only = True
    search_space = (Param("c", 0.005, 5.0, log=True, unit="examples/update", doc="decay speed"),)

    def __init__(self, *, initial: int = 32, dwell: int = 1, c: float = 0.1) -> None:
        super().__init__(initial=initial, dwell=dwell)
        self.c = c

    def raw_damping(self, progress: Progress) -> float:
        return self.initial + 1 + self.c * (progress.update + 1)


class AdaDamp(Damper):
    """Adaptive damping from the training loss: ``d = ⌈B0 · (F(w0) − F*) / (F(wk) − F*)⌉``.

    F is the mean training loss on a fixed subset of the training set (the engine evaluates it
    when the damping is recomputed, i.e. every ``dwell`` updates).

    Args:
        f_star: a lower bound of the loss (0 for cross-entropy).
    """

    name = "adadamp"
    search_space = (
        Param("initial", 8, 256, log=True, integer=True, unit="examples", doc="B0"),
        Param("dwell", 1, 100, log=True, integer=True, unit="updates", doc="recompute every"),
    )
    max_ratio: ClassVar[float] = 1e6  # bounds d when F(wk) reaches F*

    def __init__(self, *, initial: int = 32, dwell: int = 10, f_star: float = 0.0) -> None:
        super().__init__(initial=initial, dwell=dwell)
        self.f_star = f_star

    def raw_damping(self, progress: Progress) -> float:
        if progress.train_loss is None:
            raise ConfigError("batch_size", self.name, "a trainer that supplies train_loss")
        gap = progress.train_loss() - self.f_star
        if getattr(self, "gap0_", None) is None:
            self.gap0_ = gap
        ratio = self.gap0_ / gap if gap > 0 else self.max_ratio
        return self.initial * min(max(ratio, 0.0), self.max_ratio)


class RadaDamp(Damper):
    """Robust adaptive damping: ``d = B0 · max(1, R0 / (5·ema_loss + ema_g²))``, never below B0.

    The rule of the AdaDamp repository (stsievert/adadamp, ``adadamp/damping.py``, commit
    c26bc46 "RadaDamp"), from each update's batch loss and squared gradient norm ``g²`` (what
    :meth:`observe` receives after the update)::

        R0  = mean of (5·loss + g²) over updates 1..warmup   (update 0 is left out)
        ema = rho·ema + (1 − rho)·new, for the loss and g², after the warm-up, from its means
        d   = B0 · max(1, R0 / (5·ema_loss + ema_g²)), at most B0 · max_ratio

    The damping is B0 for updates 0..warmup, until R0 is known. The state (warm-up sums, R0,
    the EMAs) is in the ``*_`` attributes: a damper restored from :meth:`state_dict` goes on
    exactly.

    Args:
        rho: the EMA factor of the batch loss and of ‖g‖².
        warmup: updates whose mean gives the reference R0.
    """

    name = "radadamp"
    uses_grad_norm = True
    search_space = (Param("rho", 0.5, 0.999, doc="EMA factor of loss and squared grad norm"),)
    max_ratio: ClassVar[float] = 1e6
    loss_weight: ClassVar[float] = 5.0  # the weight of the loss against ‖g‖² in R0 and ema

    def __init__(
        self, *, initial: int = 32, dwell: int = 1, rho: float = 0.9, warmup: int = 50
    ) -> None:
        super().__init__(initial=initial, dwell=dwell)
        self.rho = rho
        self.warmup = warmup

    def validate(self) -> None:
        if not 0 < self.rho < 1:
            raise ConfigError("batch_size__rho", self.rho, "a number in (0, 1)")
        positive_int("batch_size__warmup", self.warmup)

    def observe(self, *, loss: float, grad_sq_norm: float) -> None:
        seen = getattr(self, "observed_", 0)  # updates observed before this one
        self.observed_ = seen + 1
        if seen == 0:
            return  # the first update is left out of R0
        if seen <= self.warmup:
            self.sum_loss_ = getattr(self, "sum_loss_", 0.0) + loss
            self.sum_g2_ = getattr(self, "sum_g2_", 0.0) + grad_sq_norm
            if seen == self.warmup:
                self.ema_loss_ = self.sum_loss_ / self.warmup
                self.ema_g2_ = self.sum_g2_ / self.warmup
                self.r0_ = self.loss_weight * self.ema_loss_ + self.ema_g2_
            return
        r = self.rho
        self.ema_loss_ = r * self.ema_loss_ + (1 - r) * loss
        self.ema_g2_ = r * self.ema_g2_ + (1 - r) * grad_sq_norm

    def raw_damping(self, progress: Progress) -> float:
        r0 = getattr(self, "r0_", None)
        if r0 is None:
            return float(self.initial)
        current = self.loss_weight * self.ema_loss_ + self.ema_g2_
        ratio = r0 / current if current > 0 else self.max_ratio
        return self.initial * min(max(ratio, 1.0), self.max_ratio)


DAMPERS: dict[str, type[Damper]] = {
    cls.name: cls for cls in (SGD, GeoDampLR, CntsDampLR, GeoDamp, PadaDamp, AdaDamp, RadaDamp)
}


def _damper_class(path: str) -> type[Damper]:
    accepted = f"one of {sorted(DAMPERS)} or an import path 'package.module:Damper'"
    if ":" not in path:
        raise ConfigError("batch_size", path, accepted)
    cls = resolve(path, param="batch_size", accepted=accepted)
    if not (isinstance(cls, type) and issubclass(cls, Damper)):
        raise ConfigError("batch_size", path, "a subclass of damptune.dampers.Damper")
    return cls


def spec_of(damper: Damper) -> str:
    """How a damper travels in a configuration: its registered name, else its import path."""
    return damper.name if DAMPERS.get(damper.name) is type(damper) else import_path(type(damper))


def get_damper(spec: str | type[Damper] | Damper | int, **params: Any) -> Damper:
    """Build a damper from a name, a class, an instance (cloned) or an int (constant B0).

    Example:
        >>> get_damper("geodamp", initial=128, factor=5, delay=60).factor
        5
    """
    accepted = (f"one of {sorted(DAMPERS)}, an import path 'package.module:Damper', a Damper "
                "class or instance, or an int")
    damper_cls: type[Damper]
    if isinstance(spec, Damper):
        template = cast(Damper, spec)
        damper_cls, params = type(template), {**template.get_params(), **params}
    elif isinstance(spec, bool):
        raise ConfigError("batch_size", spec, accepted)
    elif isinstance(spec, int):
        damper_cls, params = SGD, {"initial": spec, **params}
    elif isinstance(spec, str):
        damper_cls = DAMPERS.get(spec) or _damper_class(spec)
    elif isinstance(spec, type) and issubclass(spec, Damper):
        damper_cls = spec
    else:
        raise ConfigError("batch_size", spec, accepted)
    try:
        return damper_cls(**params)
    except TypeError as exc:
        names = sorted(damper_cls().get_params())
        raise ConfigError(
            "batch_size__*", sorted(params), f"parameters of {damper_cls.__name__}: {names}"
        ) from exc
