"""Membership events of a Dask cluster, safe to subscribe to.

:class:`MembershipPlugin` is a Dask ``SchedulerPlugin``: registered once on a client
(``client.register_plugin(MembershipPlugin())``), it publishes on :data:`TOPIC` an event
``{"action": "add-worker" | "remove-worker", "worker": address}`` each time a worker joins or
leaves. Subscribers (``client.subscribe_topic(TOPIC, handler)``) are woken by them.

Why not the scheduler's own ``"all"`` topic: it also carries events whose payload cannot be
serialized to a client (``replicate``, sent by ``scatter(broadcast=True)``, lists
``WorkerState`` objects). A subscriber of ``"all"`` gets its connection closed by the
scheduler, and the client's reconnect then fails (seen with distributed 2026.8.0).
"""

from __future__ import annotations

from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["TOPIC", "MembershipPlugin"]

TOPIC = "damptune-membership"


class MembershipPlugin(SchedulerPlugin):
    """Publish each worker's arrival and departure (its address) on :data:`TOPIC`."""

    name = "damptune-membership"

    def add_worker(self, scheduler: Any, worker: str) -> None:
        scheduler.log_event(TOPIC, {"action": "add-worker", "worker": worker})

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str,
                      **kwargs: Any) -> None:
        scheduler.log_event(TOPIC, {"action": "remove-worker", "worker": worker})
