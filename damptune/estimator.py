"""``DampedClassifier``: the engine behind a scikit-learn estimator.

Example:
    >>> import numpy as np
    >>> from damptune import DampedClassifier
    >>> rng = np.random.default_rng(0)
    >>> X = rng.normal(size=(256, 8)).astype("float32")
    >>> y = (X[:, 0] > 0).astype("int64")
    >>> clf = DampedClassifier(module="torch.nn:Linear", module__in_features=8,
    ...     module__out_features=2, lr=0.1, batch_size="geodamp", batch_size__initial=32,
    ...     batch_size__delay=1, max_batch_size=128, max_epochs=3).fit(X, y)
    >>> clf.score(X, y) > 0.9
    True
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin

from damptune.cluster import connect, worker_addresses
from damptune.config import TrainConfig, cap_for, import_path, resolve
from damptune.dampers import get_damper, spec_of
from damptune.errors import ConfigError
from damptune.netmodel import DEFAULT_PROFILE
from damptune.state import TrainData, TrainState
from damptune.trainer import Callback, train
from damptune.validate import workers_for_ranks

__all__ = ["DampedClassifier"]

_PREFIXES = ("module__", "optimizer__", "batch_size__")

# estimator parameters that go to TrainConfig unchanged, under the same name
_PASSED_THROUGH = (
    "per_worker_batch", "min_workers", "max_workers", "max_epochs", "max_updates",
    "eval_every", "checkpoint_every", "checkpoint_seconds", "checkpoint_keep", "seed", "mode",
    "device", "timeout", "profile", "overhead", "micro_batch", "share_gpus", "eval_flush",
    "sync",
)


class DampedClassifier(ClassifierMixin, BaseEstimator):
    """Train a PyTorch classifier with damped data-parallel SGD on a Dask cluster.

    Parameters are stored unchanged; nested parameters use ``__``: ``module__hidden=64`` goes
    to the module's constructor, ``optimizer__momentum=0.9`` to the optimizer's,
    ``batch_size__factor=5`` to the damper's.

    Args:
        module: an ``nn.Module`` class, a callable returning one, or ``"pkg.mod:Name"``. If its
            constructor takes ``input_shape``/``n_classes`` and they are not given, they are
            taken from the data.
        optimizer: a ``torch.optim.Optimizer`` class (or its import path).
        lr: initial learning rate lr0.
        batch_size: the damper: a name (``"geodamp"``…), a Damper class or instance, or an int
            (constant batch size).
        max_batch_size: the cap in examples (default ``max_workers × per_worker_batch``).
        per_worker_batch: examples per rank; ranks ``P = clip(ceil(B / per_worker_batch),
            min_workers, max_workers)``.
        micro_batch: examples per forward+backward pass of a rank (default
            ``per_worker_batch``): a larger share is summed over micro-batches.
        max_epochs: passes over the training set.
        max_updates: stop after this many model updates in all (None: no limit).
        eval_every: epochs between evaluations on ``eval_set``.
        eval_flush: in the data-parallel modes, each of those evaluations ends the ranks'
            segment, so ``callback`` sees it before training goes on (needed to stop training
            at an evaluation). False: evaluations reach ``callback`` with the segment's other
            records (at most ``flush_seconds``, 1 s of training, later), with fewer round trips
            to the ranks; the training and the records are the same.
        mode: ``"local"`` (one process), ``"centralized"`` or ``"decentralized"``.
        cluster: None (a LocalCluster of ``max_workers`` made for each fit), a scheduler address,
            a ``distributed.Client`` or a Dask cluster.
        processes: the Dask workers the ranks run on: None, one per rank (as a real cluster
            trains); N, the cluster's first N (a LocalCluster of N when ``cluster`` is None),
            each running several ranks' shares of the batch when P > N. ``centralized`` mode
            only: the same math and the same simulated time, without P processes taking turns
            on a few cores (what a grid's ``workers_per_trial`` does).
        device: ``cpu``, ``cuda``, ``cuda:N`` or ``auto``; each rank on its worker's GPU, NCCL
            between ranks with a GPU each (:mod:`damptune.devices`).
        share_gpus: let ranks share a GPU (then gloo); else that is an error.
        checkpoint_path: local path or fsspec URL of the checkpoint.
        checkpoint_every: updates between checkpoints (None: only at the end).
        checkpoint_seconds: seconds of training between checkpoints (and on SIGTERM).
        checkpoint_keep: checkpoint generations kept (an unreadable newest one falls back).
        resume: continue from ``checkpoint_path`` when it exists.
        callback: called with every progress record; may raise ``StopTraining``.
        profile: network profile of the records' simulated time ``time_sim``
            (:mod:`damptune.netmodel`).
        sync: how an update tolerates the profile's stragglers: sync, backup:B or ssp:S.
        compute_per_example: seconds of forward+backward per example on one rank for the
            simulated time (None: measured on this machine, cached).
        overhead: seconds per update added to the simulated time.
    """

    def __init__(
        self,
        module: Any = None,
        *,
        optimizer: Any = torch.optim.SGD,
        lr: float = 0.05,
        batch_size: Any = "sgd",
        max_batch_size: int | None = None,
        per_worker_batch: int = 128,
        min_workers: int = 1,
        max_workers: int = 4,
        max_epochs: float = 10.0,
        max_updates: int | None = None,
        eval_every: float = 1.0,
        mode: str = "local",
        cluster: Any = None,
        processes: int | None = None,
        device: str = "cpu",
        seed: int = 0,
        checkpoint_path: str | None = None,
        checkpoint_every: int | None = None,
        checkpoint_seconds: float | None = None,
        checkpoint_keep: int = 2,
        resume: bool = False,
        callback: Callback | None = None,
        timeout: float = 120.0,
        profile: str = DEFAULT_PROFILE,
        compute_per_example: float | None = None,
        overhead: float = 0.0,
        micro_batch: int | None = None,
        share_gpus: bool = False,
        eval_flush: bool = True,
        sync: str = "sync",
        **kwargs: Any,
    ) -> None:
        self.module = module
        self.optimizer = optimizer
        self.lr = lr
        self.batch_size = batch_size
        self.max_batch_size = max_batch_size
        self.per_worker_batch = per_worker_batch
        self.min_workers = min_workers
        self.max_workers = max_workers
        self.max_epochs, self.max_updates = max_epochs, max_updates
        self.eval_every = eval_every
        self.mode = mode
        self.cluster, self.processes = cluster, processes
        self.device = device
        self.seed = seed
        self.checkpoint_path = checkpoint_path
        self.checkpoint_every, self.checkpoint_seconds = checkpoint_every, checkpoint_seconds
        self.checkpoint_keep = checkpoint_keep
        self.resume = resume
        self.callback = callback
        self.timeout, self.profile, self.sync = timeout, profile, sync
        self.compute_per_example = compute_per_example
        self.overhead, self.micro_batch, self.share_gpus, self.eval_flush = (
            overhead, micro_batch, share_gpus, eval_flush)
        _check_prefixed(kwargs)
        self.__dict__.update(kwargs)

    # -- scikit-learn parameter protocol with prefixed (nested) parameters ------------------
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        params = super().get_params(deep=False)
        params.update({k: v for k, v in vars(self).items() if k.startswith(_PREFIXES)})
        return params

    def set_params(self, **params: Any) -> DampedClassifier:
        nested = {k: v for k, v in params.items() if k.startswith(_PREFIXES)}
        _check_prefixed(nested)
        self.__dict__.update(nested)
        plain = {k: v for k, v in params.items() if k not in nested}
        if plain:
            super().set_params(**plain)
        return self

    def _prefixed(self, prefix: str) -> dict[str, Any]:
        return {k[len(prefix):]: v for k, v in vars(self).items() if k.startswith(prefix)}

    # -- configuration ----------------------------------------------------------------------
    def _config(self, data: TrainData, n_classes: int) -> TrainConfig:
        if self.module is None:
            raise ConfigError("module", None, "an nn.Module class, a callable or 'pkg.mod:Name'")
        module = resolve(self.module) if isinstance(self.module, str) else self.module
        module_kwargs = self._prefixed("module__")
        try:
            sig = inspect.signature(module)
            if "input_shape" in sig.parameters and "input_shape" not in module_kwargs:
                module_kwargs["input_shape"] = tuple(data.X.shape[1:])
            if "n_classes" in sig.parameters and "n_classes" not in module_kwargs:
                module_kwargs["n_classes"] = n_classes
        except (TypeError, ValueError):
            pass
        optimizer = self.optimizer
        if isinstance(optimizer, str):
            optimizer = resolve(optimizer, param="optimizer")
        damper = get_damper(self.batch_size, **self._prefixed("batch_size__"))
        max_batch = self.max_batch_size
        if max_batch is None:
            max_batch = cap_for(self.max_workers, self.per_worker_batch)
        return TrainConfig(
            module=import_path(module),
            module_kwargs=module_kwargs,
            optimizer=import_path(optimizer),
            optimizer_kwargs=self._prefixed("optimizer__"),
            lr=self.lr,
            damper=spec_of(damper),
            damper_kwargs=damper.get_params(),
            max_batch_size=max_batch,
            **{name: getattr(self, name) for name in _PASSED_THROUGH},
            # backend 'auto': the ranks' placement chooses (damptune.devices.choose_backend)
            n_train=len(data.y),
            compute_per_example=self.compute_per_example,
            compute_fixed=None if self.compute_per_example is None else 0.0,
        )

    # -- fitting ----------------------------------------------------------------------------
    def fit(self, X: Any, y: Any, *, eval_set: tuple[Any, Any] | None = None) -> DampedClassifier:
        """Train from scratch (or from ``checkpoint_path`` if ``resume``); returns self."""
        self.classes_ = np.unique(np.asarray(y))
        data = self._data(X, y, eval_set)
        config = self._config(data, len(self.classes_))
        self._run(config, data, state=None)
        return self

    def partial_fit(
        self, X: Any, y: Any, *, epochs: float = 1.0, eval_set: tuple[Any, Any] | None = None
    ) -> DampedClassifier:
        """Continue the fitted model for ``epochs`` more epochs (fit first if not fitted)."""
        if not hasattr(self, "state_"):
            self.classes_ = np.unique(np.asarray(y))
        data = self._data(X, y, eval_set)
        config = self._config(data, len(self.classes_))
        state = getattr(self, "state_", None)
        config.max_epochs = (state.epoch if state is not None else 0.0) + epochs
        self._run(config, data, state=state)
        return self

    def _data(self, X: Any, y: Any, eval_set: tuple[Any, Any] | None) -> TrainData:
        y_arr = np.asarray(y)
        if hasattr(self, "classes_") and not np.isin(y_arr, self.classes_).all():
            raise ConfigError("y", "labels outside classes_",
                              f"labels in {self.classes_.tolist()}")
        encode = {c: i for i, c in enumerate(self.classes_.tolist())}
        y_enc = np.vectorize(encode.__getitem__, otypes=[np.int64])(y_arr)
        if eval_set is None:
            return TrainData.from_arrays(X, y_enc)
        y_val = np.vectorize(encode.__getitem__, otypes=[np.int64])(np.asarray(eval_set[1]))
        return TrainData.from_arrays(X, y_enc, eval_set[0], y_val)

    def _run(self, config: TrainConfig, data: TrainData, state: TrainState | None) -> None:
        with contextlib.ExitStack() as stack:
            cluster, workers = self._placement(stack, config)
            state = train(
                config, data, state=state, callback=self.callback,
                checkpoint_path=self.checkpoint_path, resume=self.resume and state is None,
                cluster=cluster, workers=workers,
            )
        self.state_ = state
        self.module_ = state.model
        self.history_ = state.history
        self.n_updates_ = state.update
        self.examples_seen_ = state.examples_seen
        self.stopped_ = state.stopped

    def _placement(self, stack: contextlib.ExitStack,
                   config: TrainConfig) -> tuple[Any, list[str] | None]:
        """The cluster to train on and the workers the ranks run on (None: all of its)."""
        n = self.processes
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ConfigError("processes", n, "None or an integer >= 1")
        if n is None or config.mode == "local":
            return self.cluster, None
        workers_for_ranks("processes", n, mode=config.mode, ranks=config.max_workers,
                          ranks_name="max_workers", unset="None")
        client = stack.enter_context(connect(self.cluster, n_workers=n))
        return client, worker_addresses(client)[:n]

    # -- inference --------------------------------------------------------------------------
    def predict_proba(self, X: Any) -> np.ndarray:
        model = self.module_
        device = next(model.parameters()).device
        Xt = torch.as_tensor(np.asarray(X), dtype=torch.float32)
        model.eval()
        out = []
        with torch.no_grad():
            for start in range(0, len(Xt), 4096):
                out.append(torch.softmax(model(Xt[start:start + 4096].to(device)), 1).cpu())
        model.train()
        return torch.cat(out).numpy()

    def predict(self, X: Any) -> np.ndarray:
        return self.classes_[self.predict_proba(X).argmax(1)]


def _check_prefixed(kwargs: dict[str, Any]) -> None:
    for key in kwargs:
        if not key.startswith(_PREFIXES) or key in _PREFIXES:
            raise ConfigError(
                key, kwargs[key],
                "a parameter of DampedClassifier or a nested one starting with "
                "'module__', 'optimizer__' or 'batch_size__'",
            )
