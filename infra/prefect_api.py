"""The local stack's conversations with the Prefect server, through Prefect's Python client.

Every function takes the API URL (``http://127.0.0.1:PORT/api``) and opens a
:class:`~prefect.client.orchestration.SyncPrefectClient` on it, so that nothing depends on the
caller's Prefect profile or environment.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psutil
import yaml
from prefect.client.orchestration import SyncPrefectClient
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterState,
    FlowRunFilterStateType,
    LogFilter,
    LogFilterFlowRunId,
    WorkPoolFilter,
    WorkPoolFilterName,
)
from prefect.client.schemas.objects import StateType, WorkerStatus
from prefect.client.schemas.sorting import LogSort
from prefect.events.schemas.automations import AutomationCore
from prefect.exceptions import ObjectNotFound
from prefect.states import Crashed

__all__ = ["client", "ensure_pool", "worker_online", "ensure_zombie_automation",
           "crash_orphaned_runs", "run_deployment", "wait_for_flow_run", "read_flow_run",
           "recent_logs",
           "ZOMBIE_AUTOMATION", "ZOMBIE_AUTOMATION_FILE", "HEARTBEAT_S"]

HEARTBEAT_S = 30  # PREFECT_FLOWS_HEARTBEAT_FREQUENCY of the worker's flow runs (minimum 30)
# the zombie-run automation, as `prefect automation create --from-file` takes it; its name:
ZOMBIE_AUTOMATION_FILE = Path(__file__).resolve().parent / "automation-zombie.yaml"
ZOMBIE_AUTOMATION = yaml.safe_load(ZOMBIE_AUTOMATION_FILE.read_text())["name"]
IN_FLIGHT = [StateType.RUNNING, StateType.PENDING, StateType.CANCELLING]


@contextlib.contextmanager
def client(api_url: str) -> Iterator[SyncPrefectClient]:
    """A synchronous Prefect client on ``api_url``."""
    with SyncPrefectClient(api_url, httpx_settings={"timeout": 10}) as c:
        yield c


def ensure_pool(api_url: str, pool: str) -> None:
    """Create the work pool ``pool`` (type ``process``) unless it exists."""
    with client(api_url) as c:
        try:
            c.read_work_pool(pool)
        except ObjectNotFound:
            c.create_work_pool(WorkPoolCreate(name=pool, type="process"))


def worker_online(api_url: str, pool: str, worker_name: str, *, since: float) -> bool:
    """Whether the server lists the worker ONLINE with a heartbeat sent after ``since``
    (the worker process's start: a previous worker of the same name left its own)."""
    try:
        with client(api_url) as c:
            workers = c.read_workers_for_work_pool(pool)
    except Exception:  # noqa: BLE001 - the server is not up (yet): not online
        return False
    return any(w.name == worker_name and w.status == WorkerStatus.ONLINE
               and w.last_heartbeat_time is not None
               and w.last_heartbeat_time.timestamp() >= since for w in workers)


def ensure_zombie_automation(api_url: str) -> bool:
    """Create (once, by name) the automation of ``ZOMBIE_AUTOMATION_FILE``: it marks Crashed a
    flow run whose heartbeats stop.

    A machine that dies takes its worker and its flow runs with it: nobody is left to report
    them, and they would show RUNNING for ever. Flow runs of the stack's worker send a
    heartbeat every ``HEARTBEAT_S`` seconds; Prefect's recipe for such "zombies" (a proactive
    trigger on ``prefect.flow-run.heartbeat``, docs: "Detect zombie flows") marks a run Crashed
    when 3 heartbeats are missing, which also frees its deployment's concurrency slot. The file
    is read as ``prefect automation create --from-file`` reads it, so that command creates the
    same automation on a server of your own. Returns True when this call created it.
    """
    automation = AutomationCore.model_validate(yaml.safe_load(ZOMBIE_AUTOMATION_FILE.read_text()))
    with client(api_url) as c:
        if c.read_automations_by_name(automation.name):
            return False
        c.create_automation(automation)
    return True


def crash_orphaned_runs(api_url: str, pool: str) -> list[str]:
    """Mark CRASHED the pool's in-flight flow runs whose process is gone; return their names.

    A run left RUNNING by a stopped worker would otherwise stay RUNNING for ever and hold its
    deployment's concurrency slot, so that the next run of that deployment never starts.
    """
    try:
        with client(api_url) as c:
            runs = c.read_flow_runs(
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=IN_FLIGHT))),
                work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[pool])))
            orphans = [r for r in runs if not _alive(r.infrastructure_pid)]
            for run in orphans:
                c.set_flow_run_state(run.id, Crashed(message=(
                    "its process is gone: the local stack was stopped (python -m infra.stack "
                    "down) or the machine restarted while it ran; run the deployment again to "
                    "resume")), force=True)
    except Exception:  # noqa: BLE001 - no server: nothing to mark
        return []
    return [r.name for r in orphans]


def _alive(pid: Any) -> bool:
    try:
        return bool(pid) and "prefect" in " ".join(psutil.Process(int(pid)).cmdline())
    except (ValueError, psutil.Error):
        return False


def run_deployment(api_url: str, name: str, parameters: dict[str, Any]) -> UUID:
    """Create a flow run of deployment ``name`` (``flow/deployment``) with Prefect's own
    ``run_deployment``, as ``prefect deployment run`` does, without waiting; its id."""
    from prefect.deployments import run_deployment as prefect_run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api_url}):
        return prefect_run_deployment(name, parameters=parameters, timeout=0,
                                      as_subflow=False).id


def wait_for_flow_run(api_url: str, flow_run_id: str | UUID, *,
                      timeout_s: float | None = None) -> dict[str, Any]:
    """Wait, with Prefect's ``wait_for_flow_run`` (it follows the run's state events), until
    the flow run is in a final state; the run as JSON (``state``, ``name``, ``parameters``).

    Raises:
        TimeoutError: the run was not in a final state after ``timeout_s`` seconds.
    """
    import asyncio

    from prefect.exceptions import FlowRunWaitTimeout
    from prefect.flow_runs import wait_for_flow_run as prefect_wait
    from prefect.settings import PREFECT_API_URL, temporary_settings

    run_id = UUID(str(flow_run_id))
    with temporary_settings({PREFECT_API_URL: api_url}):
        try:
            run = asyncio.run(prefect_wait(run_id, timeout=timeout_s))  # type: ignore[arg-type]
        except FlowRunWaitTimeout:
            state = read_flow_run(api_url, run_id).get("state") or {}
            raise TimeoutError(f"flow run {run_id} is still {state.get('name')} after "
                               f"{timeout_s:.0f} s") from None
    return run.model_dump(mode="json")


def read_flow_run(api_url: str, flow_run_id: str | UUID) -> dict[str, Any]:
    """The flow run as JSON (``state``, ``name``, ``parameters``, …)."""
    with client(api_url) as c:
        return c.read_flow_run(UUID(str(flow_run_id))).model_dump(mode="json")


def recent_logs(api_url: str, flow_run_id: str | UUID, n: int) -> list[dict[str, Any]]:
    """The last ``n`` log records of a flow run, oldest first."""
    with client(api_url) as c:
        run_filter = LogFilterFlowRunId(any_=[UUID(str(flow_run_id))])
        logs = c.read_logs(LogFilter(flow_run_id=run_filter), limit=n,
                           sort=LogSort.TIMESTAMP_DESC)
    return [log.model_dump(mode="json") for log in reversed(logs)]
