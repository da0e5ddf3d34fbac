"""MLflow as the place to compare and pick: models, the model registry, dataset inputs.

- Each search cell's best trial is an MLflow PyTorch model (an MLflow 3 *logged model*, name
  ``model``) whose source run is **the best trial's run**: its weights are that trial's final
  checkpoint, its params and metrics are that run's. The cell's parent run is tagged
  ``damptune.best_model_id`` and ``damptune.best_model_uri`` (``models:/<model id>``).
- The grid's best per (network, model) is a version of the registered model
  ``<grid_name>-<model>-n<network>`` with the alias ``best``: the first of the answer on the
  held-out seeds (``answer.json``; the matched comparison, which has no search cell of its
  own, aside) when the grid validated, else the first of the search ranking (``report.md``);
  a rerun whose best is the same model adds no version.
- The dataset is an MLflow dataset input of every run (name, digest, ``data_seed``).

Every call goes through the explicit client of :mod:`tasks.tracking`, never MLflow's global
tracking URI (cells and trials run on threads, grids in one process may use different
stores): this does what ``mlflow.pytorch.log_model`` and ``mlflow.register_model`` do, with
that client.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from typing import Any

import mlflow
import numpy as np
import torch
from mlflow.data.code_dataset_source import CodeDatasetSource
from mlflow.data.numpy_dataset import from_numpy
from mlflow.entities import DatasetInput, InputTag, LoggedModelOutput, Metric
from mlflow.exceptions import MlflowException
from mlflow.models import Model
from mlflow.tracking import MlflowClient
from torch import nn

from damptune import TrainConfig, load_checkpoint
from damptune.state import build_model
from models import Dataset, load_dataset
from tasks import tracking
from tasks.answer import BASELINE, rank_cells
from tasks.grid import Cell, GridSettings, checkpoint_path, share_rows
from tasks.logs import run_logger
from tasks.stats import answer_rows
from tasks.validation import MATCHED_SUFFIX, validation_rows

__all__ = ["dataset_input", "log_cell_model", "log_best_of_cell", "register_best",
           "publish_models", "registered_name", "module_from_checkpoint", "ALIAS", "MODEL_TAG"]

MODEL_TAG = "damptune.best_model_id"  # on the best trial's run and its cell's parent run
ALIAS = "best"
# the metrics of the best trial's run shown with its model (MLflow's Models tab)
MODEL_METRICS = ("objective", "best_accuracy", "reached_target", "test_accuracy")
log = logging.getLogger("damptune.tasks")
# torch.export (MLflow's "pt2" format) keeps global state: one export at a time per process
_EXPORT = threading.Lock()


def registered_name(grid_name: str, model: str, network: int) -> str:
    """The registered model of a grid's (network, model) pair: ``grid-mlp-n4``."""
    return f"{grid_name}-{model}-n{network}"


def dataset_input(ds: Dataset, *, data_seed: int) -> DatasetInput:
    """The dataset as an MLflow input: its name, its digest (``Dataset.digest``), and
    ``data_seed`` in its source and the input's tags."""
    seed = str(data_seed)
    source = CodeDatasetSource(tags={"damptune.dataset": ds.name, "damptune.data_seed": seed})
    data = from_numpy(ds.X_train, source=source, targets=ds.y_train, name=ds.name,
                      digest=ds.digest())
    return DatasetInput(data._to_mlflow_entity(), tags=[
        InputTag("mlflow.data.context", "training"), InputTag("damptune.data_seed", seed)])


def module_from_checkpoint(path: str) -> nn.Module:
    """The model of a trial's checkpoint (its final weights), in evaluation mode."""
    ckpt = load_checkpoint(path)
    module = build_model(TrainConfig.from_dict(ckpt["config"]))
    module.load_state_dict(ckpt["model"])
    return module.eval()


def log_cell_model(client: MlflowClient, exp_id: str, *, parent: str, cell: Cell,
                   run_id: str, checkpoint: str, ds: Dataset, data_seed: int) -> str:
    """Log the cell's best trial (run ``run_id``, weights at ``checkpoint``) as an MLflow
    PyTorch model, once (a rerun finds it by the run's tag); tag the parent run with it and
    log the dataset on the parent. Returns the logged model's id."""
    client.log_inputs(parent, datasets=[dataset_input(ds, data_seed=data_seed)])
    model_id = client.get_run(run_id).data.tags.get(MODEL_TAG)
    if not model_id:
        model_id = _log_model(client, exp_id, run_id=run_id, checkpoint=checkpoint,
                              example=np.asarray(ds.X_test[:5]), cell=cell)
    tracking.set_tags(client, parent, {MODEL_TAG: model_id,
                                       "damptune.best_model_uri": f"models:/{model_id}"})
    return model_id


def log_best_of_cell(client: MlflowClient, grid: GridSettings, cell: Cell, exp_id: str,
                     parent: str, *, best_trial: int, checkpoint: str) -> str | None:
    """:func:`log_cell_model` for a search cell's best trial (``best_trial``, its checkpoint
    at ``checkpoint``). A failure is a warning (the trial's results and checkpoint are kept;
    a rerun logs it), except MLflow staying unreachable: returns the model's id, or None."""
    try:
        run_id = tracking.find_trial_run(client, exp_id, cell_key=cell.key, number=best_trial)
        if run_id is None:
            raise LookupError(f"no MLflow run of trial {best_trial}")
        ds = load_dataset(grid.dataset, seed=grid.data_seed, root=grid.data_root or None)
        return tracking.with_retries(lambda: log_cell_model(
            client, exp_id, parent=parent, cell=cell, run_id=run_id, checkpoint=checkpoint,
            ds=ds, data_seed=grid.data_seed), what="logging the cell's best model")
    except tracking.TrackingUnavailable:
        raise  # MLflow is down: the cell's run cannot be tagged either (its caller says so)
    except Exception as exc:  # noqa: BLE001 - the trial's results stay in Optuna and MLflow
        log.warning("%s: its best trial %s was not logged as an MLflow model: %s: %s",
                    cell.key, best_trial, type(exc).__name__, tracking.redact(str(exc))[:500])
        return None


def _log_model(client: MlflowClient, exp_id: str, *, run_id: str, checkpoint: str,
               example: np.ndarray, cell: Cell) -> str:
    """What ``mlflow.pytorch.log_model(name="model")`` does for run ``run_id``: a logged
    model with the run's params, its files (pickled module, signature and input example,
    requirements), linked to the run as its output, with the run's final metrics."""
    module = module_from_checkpoint(checkpoint)
    run = client.get_run(run_id)
    logged = client.create_logged_model(
        exp_id, name="model", source_run_id=run_id, model_type="classifier",
        params={k: str(v) for k, v in run.data.params.items()},
        tags={tracking.CELL_TAG: cell.key, "damptune.network": str(cell.network),
              "damptune.algorithm": cell.algorithm, "damptune.model": cell.model})
    with tempfile.TemporaryDirectory() as tmp, _EXPORT:
        local = os.path.join(tmp, "model")
        mlflow.pytorch.save_model(
            module, local, input_example=example, serialization_format="pt2",
            mlflow_model=Model(artifact_path=logged.artifact_location, run_id=run_id,
                               model_uuid=logged.model_id, model_id=logged.model_id),
            # given, not inferred (inference loads the model in a subprocess); "pt2" is
            # torch.export's graph: loading needs torch, not damptune's model classes
            pip_requirements=[f"torch=={torch.__version__.split('+')[0]}",
                              f"mlflow=={mlflow.__version__}"])
        client.log_model_artifacts(logged.model_id, local)
    client.finalize_logged_model(logged.model_id, "READY")
    client.log_outputs(run_id, [LoggedModelOutput(logged.model_id, step=0)])
    # each metric's last value again, with the model: the run's history stays as it was
    last = [max(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
            for key in MODEL_METRICS if key in run.data.metrics]
    client.log_batch(run_id, metrics=[Metric(m.key, m.value, m.timestamp, m.step, run_id=run_id,
                                             model_id=logged.model_id) for m in last])
    tracking.set_tags(client, run_id, {MODEL_TAG: logged.model_id})
    return str(logged.model_id)


def log_runner_up(client: MlflowClient, grid: GridSettings, cell: Cell, source: Cell,
                  exp_id: str, *, number: int) -> str | None:
    """The search cell ``source``'s model follows its answer on the held-out seeds: when its
    best missed the target there and a runner-up answers instead (:mod:`tasks.validation`),
    the validation cell ``cell``'s trial ``number`` (that configuration, trained to the
    target on a held-out seed) becomes the search cell's model (its parent run's tag), the one
    :func:`register_best` registers. Returns the model's id, or None (a warning)."""
    parent = tracking.find_cell_run(client, exp_id, cell_key=source.key)
    if parent is None:
        log.warning("%s: no MLflow run of the cell: its runner-up is not logged", source.key)
        return None
    return log_best_of_cell(client, grid, cell, exp_id, parent, best_trial=number,
                            checkpoint=checkpoint_path(grid, cell, number))


def register_best(client: MlflowClient, settings: GridSettings,
                  rows: list[dict[str, Any]]) -> dict[str, str]:
    """Register each (network, model) pair's best (rank 1 of the held-out answer, else of the
    search ranking; a shared baseline counts at every size) under
    ``<grid_name>-<model>-n<network>`` and move its alias ``best`` there. A pair whose best
    is already a version gets no new one. Returns ``{registered name: version}``."""
    exp_id = tracking.experiment_id(client, grid_name=settings.grid_name,
                                    artifact_root=f"{settings.run_dir}/mlartifacts")
    out, validated = {}, _answer_best(settings)
    for row in rank_cells(share_rows(rows)):
        pair = (int(row["network"]), str(row["model"]))
        if validated.get(pair, row["algorithm"] if row["rank"] == 1 else None) != row["algorithm"]:
            continue
        key = row.get("shared_from") or f"n{row['network']}/{row['algorithm']}/{row['model']}"
        runs = client.search_runs([exp_id], f"tags.`{tracking.CELL_TAG}` = '{key}' and "
                                            "tags.`damptune.kind` = 'cell'", max_results=1)
        model_id = runs[0].data.tags.get(MODEL_TAG) if runs else None
        if not model_id:
            log.warning("%s: its best trial has no MLflow model, not registered", key)
            continue
        name = registered_name(settings.grid_name, row["model"], int(row["network"]))
        out[name] = _version(client, name, model_id, grid=settings.grid_name, key=key)
        client.set_registered_model_alias(name, ALIAS, out[name])
    return out


def _answer_best(settings: GridSettings) -> dict[tuple[int, str], str]:
    """Each validated pair's first algorithm on the held-out seeds (not the matched row)."""
    answer = answer_rows(share_rows(validation_rows(settings.storage,
                                                    grid_name=settings.grid_name)),
                         baseline=BASELINE)
    best: dict[tuple[int, str], str] = {}
    for row in answer:  # ranked within each pair
        if not str(row["algorithm"]).endswith(MATCHED_SUFFIX):
            best.setdefault((int(row["network"]), str(row["model"])), str(row["algorithm"]))
    return best


def publish_models(settings: GridSettings, rows: list[dict[str, Any]], *,
                   client: MlflowClient) -> dict[str, str]:
    """:func:`register_best`; a failure is a warning (the models stay logged on their runs,
    and a rerun registers them): returns ``{registered name: version}``, or {}."""
    try:
        return tracking.with_retries(lambda: register_best(client, settings, rows),
                                     what="registering the grid's best models")
    except Exception as exc:  # noqa: BLE001 - the grid's results do not depend on it
        run_logger().warning("the grid's best models were not registered: %s: %s",
                             type(exc).__name__, tracking.redact(str(exc))[:500])
        return {}


def _version(client: MlflowClient, name: str, model_id: str, *, grid: str, key: str) -> str:
    """The version of ``name`` holding logged model ``model_id``, created if there is none
    (as ``mlflow.register_model("models:/<id>")`` does, with the model's tag
    ``mlflow.modelVersions`` naming it, the version linked to the model and to the run that
    logged it)."""
    logged = client.get_logged_model(model_id)
    # the model's artifact location, not "models:/<id>": MLflow 3.17's SQLite registry looks
    # that up through its global tracking URI (a stray ./mlflow.db), not its own store
    source, run_id = logged.artifact_location, logged.source_run_id
    try:
        client.create_registered_model(name, tags={tracking.GRID_TAG: grid}, description=(
            f"The best of grid {grid}'s search at this (network, model); alias {ALIAS!r}."))
    except MlflowException as exc:
        if "RESOURCE_ALREADY_EXISTS" not in str(exc.error_code):
            raise
    for version in client.search_model_versions(f"name = '{name}'"):
        if version.source == source or getattr(version, "model_id", None) == model_id:
            return str(version.version)
    created = client.create_model_version(name, source, run_id=run_id or None,
                                          description=f"{key}'s best trial", model_id=model_id)
    tag = client.get_logged_model(model_id).tags.get("mlflow.modelVersions")
    versions = json.loads(tag) if tag else []
    client.set_logged_model_tags(model_id, {"mlflow.modelVersions": json.dumps(
        versions + [{"name": name, "version": created.version}])})
    return str(created.version)
