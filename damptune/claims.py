"""Exclusive claims on a Dask cluster's workers, shared by every client of its scheduler.

A trial's ranks need workers of their own: two ``torch.distributed`` groups in one worker
process would destroy each other's default group. Within one flow run the worker pool
(``tasks.clusters.WorkerPool``) keeps its trials apart; :class:`ClaimsPlugin` keeps *runs*
apart: two runs of a grid (two flow runs, two machines, two Prefect workers) that share a
scheduler never hold the same worker.

The plugin lives in the scheduler (``client.register_plugin(ClaimsPlugin())``, idempotent: the
first registration wins and keeps its claims) and answers :func:`claim` and :func:`release`,
which clients run on the scheduler's event loop (``client.run_on_scheduler``), so each is
atomic. A claim is all or nothing: of the candidates, up to ``n`` not claimed by another owner,
only if there are at least ``at_least`` of them. Claims end when their owner releases them,
when the worker leaves the cluster, or when the client that made them disconnects (a killed
flow process frees its workers at once). Each release publishes an event on
:data:`damptune.membership.TOPIC`, which wakes runs waiting for workers.

Example (on a live client)::

    client.register_plugin(ClaimsPlugin())
    got = client.run_on_scheduler(claim, owner="run-1", client_id=client.id,
                                  candidates=["tcp://a", "tcp://b"], n=2, at_least=2)
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

from damptune.membership import TOPIC

__all__ = ["ClaimsPlugin", "claim", "release", "claimed_by_others", "NAME"]

NAME = "damptune-claims"


class ClaimsPlugin(SchedulerPlugin):
    """Who holds which worker: ``worker address -> (owner, client id)``."""

    name = NAME
    idempotent = True  # a second run's registration must not reset the first run's claims

    def __init__(self) -> None:
        self.claims: dict[str, tuple[str, str]] = {}

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str,
                      **kwargs: Any) -> None:
        self.claims.pop(worker, None)

    def remove_client(self, scheduler: Any, client: str) -> None:
        gone = [w for w, (_, c) in self.claims.items() if c == client]
        for worker in gone:
            del self.claims[worker]
        if gone:
            scheduler.log_event(TOPIC, {"action": "release", "workers": gone})


def _plugin(scheduler: Any) -> ClaimsPlugin:
    plugin: ClaimsPlugin | None = scheduler.plugins.get(NAME)
    if plugin is None:  # registered by open_cluster; a bare scheduler gets one here
        plugin = ClaimsPlugin()
        scheduler.add_plugin(plugin, name=NAME, idempotent=True)
    return plugin


def claim(*, owner: str, client_id: str, candidates: list[str], n: int, at_least: int,
          dask_scheduler: Any = None) -> list[str]:
    """On the scheduler: claim up to ``n`` of ``candidates`` (in their order) that are live and
    not held by another owner, if at least ``at_least`` are; else claim none. Returns the
    workers claimed for ``owner``."""
    plugin = _plugin(dask_scheduler)
    live = dask_scheduler.workers
    free = [w for w in candidates
            if w in live and plugin.claims.get(w, (owner, ""))[0] == owner]
    if len(free) < at_least:
        return []
    taken = free[:n]
    for worker in taken:
        plugin.claims[worker] = (owner, client_id)
    return taken


def release(*, owner: str, workers: list[str], dask_scheduler: Any = None) -> int:
    """On the scheduler: release ``owner``'s claims on ``workers``; returns how many."""
    plugin = _plugin(dask_scheduler)
    gone = [w for w in workers if plugin.claims.get(w, ("", ""))[0] == owner]
    for worker in gone:
        del plugin.claims[worker]
    if gone:
        dask_scheduler.log_event(TOPIC, {"action": "release", "workers": gone})
    return len(gone)


def claimed_by_others(*, owner: str, dask_scheduler: Any = None) -> list[str]:
    """On the scheduler: the workers other owners hold (for error messages)."""
    plugin = _plugin(dask_scheduler)
    return sorted(w for w, (o, _) in plugin.claims.items() if o != owner)
