"""Preemption notices: a Dask worker that gets SIGTERM (what SLURM and spot instances send
before the kill) tells the runs using it, then retires gracefully.

:class:`PreemptionPlugin` is a Dask ``WorkerPlugin``: registered once on a client
(``client.register_plugin(PreemptionPlugin())``) it is installed on every worker, including
those that join later. On SIGTERM the worker process publishes an event on :data:`TOPIC` (its
address) and calls ``Worker.close_gracefully``: the scheduler moves the worker's data to other
workers before it closes (its nanny closes with it, so it is not restarted on a machine that is
going away). A run subscribed to the topic (:class:`PreemptionWatch`) checkpoints at its next
update, then continues on the remaining or replacement workers.

The handler is installed in the worker process (the one that runs tasks). Where only the
nanny's process gets the signal (``dask worker`` as a container's first process), the nanny
closes the worker without this notice; the run still recovers, from its last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from typing import Any

from distributed import Client, WorkerPlugin

__all__ = ["TOPIC", "PreemptionPlugin", "PreemptionWatch"]

TOPIC = "damptune-preemption"
log = logging.getLogger("damptune")


class PreemptionPlugin(WorkerPlugin):
    """On SIGTERM: publish the notice, then retire the worker gracefully."""

    name = "damptune-preemption"

    def setup(self, worker: Any) -> None:
        try:
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGTERM, self._preempted, worker)
        except (RuntimeError, ValueError, NotImplementedError):
            # not the process's main thread (a thread-based worker): the process's owner
            # handles its signals
            log.debug("no SIGTERM handler on worker %s", worker.address)

    @staticmethod
    def _preempted(worker: Any) -> None:
        log.warning("worker %s got SIGTERM: retiring gracefully", worker.address)
        worker.log_event(TOPIC, {"worker": worker.address, "signal": "SIGTERM"})
        asyncio.ensure_future(worker.close_gracefully(reason="preempted (SIGTERM)"))


class PreemptionWatch:
    """The preemption notices a run's client receives, for its workers: :meth:`take` says
    (once) whether one arrived since it was last asked."""

    def __init__(self, client: Client) -> None:
        self._lock = threading.Lock()
        self._notices: list[str] = []
        self.client = client
        client.subscribe_topic(TOPIC, self._on_event)

    def _on_event(self, event: Any) -> None:
        _, msg = event
        with self._lock:
            self._notices.append(str(msg.get("worker", "")))

    def take(self) -> list[str]:
        """The workers preempted since the last call."""
        with self._lock:
            notices, self._notices = self._notices, []
        return notices

    def close(self) -> None:
        with contextlib.suppress(Exception):  # the client may be closing already
            self.client.unsubscribe_topic(TOPIC)
