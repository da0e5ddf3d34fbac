"""What an idle local Dask cluster wakes up for, and how ``local_cluster`` slows it down.

An idle Dask process spends its CPU on wake-ups: each costs ~0.25 ms on this 2-core machine (an
empty tornado timer at 50 Hz: 230 us a wake), plus what little its timers then do. The flow's
16-worker cluster is 17 processes: 16 workers, and the flow's own process, where the scheduler,
the 16 nannies and the client share one event loop. What counts is how many distinct moments a
second each process wakes at. The levers, measured with ``bench/idle_cluster.py`` and with
single 40-60 s draws on the idle 16-worker cluster (% of one core, workers + flow's process):

* :data:`QUIET_CONFIG`: Dask's own configuration keys, fewer ticks, profiles and samples.
* :class:`QuietScheduler`: workers heartbeat every 10 s instead of every second (Dask's choice
  for 11 to 49 workers; it picks 10 s itself for ~1800): ~3.7 -> ~2.4 % at 5 s; 10 s instead
  of 5 s, with the system monitor: 1.30 -> 1.05 % (1.6-1.7 -> 1.1 % on a busy machine).
* :class:`QuietWorker` and :func:`in_step`: timers of one period fire together, so that a
  process wakes once for all of them; the nannies' unread timers stop (2.5 -> 1.6 % with 1 s
  ticks; the nannies' timers: the flow's process 0.6-0.9 -> 0.5 %).

Lost workers are noticed as before: a worker that dies (even SIGKILLed) closes its connection,
which the scheduler sees at once; a hung worker is removed after the scheduler's
``distributed.scheduler.worker-ttl`` (5 minutes by default) without a heartbeat, and the floor
keeps Dask's own margin of ten heartbeats within that time.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import dask
from dask.utils import parse_timedelta
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin

__all__ = ["QUIET_CONFIG", "HEARTBEAT_SECONDS", "NANNY_TIMERS_UNREAD", "WORKER_TIMERS_UNREAD",
           "QuietScheduler", "QuietWorker", "heartbeat_floor", "in_step"]

# How often a worker tells the scheduler it is alive, at least (Dask: 0.5 s up to 10 workers,
# 1 s up to 49, 2 s up to 199, n/200 + 1 s beyond). With it a worker sends its metrics (the
# system monitor's last sample, its tasks' run times), and it retries as often to locate data
# no known worker holds (``Worker.find_missing``). A round trip costs a worker ~1 ms of CPU.
HEARTBEAT_SECONDS = 10.0
_CHECK_SECONDS = 2.0  # the scheduler's idle checks when no timeout needs them (Dask: 0.25 s)
WORKER_TIMERS_UNREAD = ("tick", "ticks", "shift_counters")  # see QuietWorker

# Dask's periodic work that an idle process pays for, slowed to what a training cluster needs:
# - profile: the dashboard's stack profiler sampled each worker 100 times a second (we never
#   open it), and the tick (an event-loop check) ran 50 times a second: both, against Dask's
#   defaults, ~41 % -> ~4 % of a core (the bench's baseline).
# - tick every 2 s (1 s before; 1 -> 2 s with the memory monitor: 1.6 -> 1.4 %): Dask logs that
#   a loop "was unresponsive" when a tick comes more than 3 s after the previous one
#   (``tick.limit``, read once at import, so not raised here): the tick must stay under it,
#   and a warning now means the loop stalled for more than ~1 s.
# - the memory monitor (spill at 70 %, pause at 80 %, the nanny's restart at 95 % of a
#   worker's memory limit) every 2 s with the tick, one wake-up for both (Dask: 100 ms).
# - the system monitor (process CPU and memory, network and disk counters) every 10 s: the
#   heartbeat reports only its last sample and the dashboard is off. Without the host's disk
#   counters (the dashboard's disk chart), a sample costs 0.19 ms instead of 0.35.
# - work stealing every 2 s with the tick (a rank's task is pinned to its worker: nothing to
#   steal; Dask: 100 ms).
QUIET_CONFIG: dict[str, Any] = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "2s",
    "distributed.admin.tick.cycle": "5s",
    "distributed.admin.system-monitor.interval": f"{HEARTBEAT_SECONDS:g}s",
    "distributed.admin.system-monitor.disk": False,
    "distributed.worker.memory.monitor-interval": "2s",
    "distributed.scheduler.work-stealing-interval": "2s",
}


def heartbeat_floor(seconds: float, worker_ttl: float | None) -> float:
    """``seconds``, capped at a tenth of ``worker_ttl`` (s; None: no TTL): the scheduler removes
    a worker only after ten heartbeats could have come, Dask's own margin."""
    return min(seconds, worker_ttl / 10) if worker_ttl else seconds


class QuietScheduler(SchedulerPlugin):
    """Floor the heartbeat interval the scheduler gives its workers at ``heartbeat`` seconds
    (:func:`heartbeat_floor`), and run its idle checks every 2 s rather than four times a
    second when ``idle-timeout`` and ``no-workers-timeout`` are unset (the checks enforce those
    timeouts).
    """

    name = "damptune-quiet"

    def __init__(self, *, heartbeat: float = HEARTBEAT_SECONDS) -> None:
        self.heartbeat = heartbeat

    async def start(self, scheduler: Any) -> None:
        floor = heartbeat_floor(self.heartbeat, scheduler.worker_ttl)
        handler = scheduler.handlers["heartbeat_worker"]

        @functools.wraps(handler)
        def heartbeat_worker(**kwargs: Any) -> Any:
            reply = handler(**kwargs)
            if "heartbeat-interval" in reply:
                reply["heartbeat-interval"] = max(reply["heartbeat-interval"], floor)
            return reply

        scheduler.handlers["heartbeat_worker"] = heartbeat_worker
        for check, timeout in (("idle-timeout", scheduler.idle_timeout),
                               ("no-workers-timeout", scheduler.no_workers_timeout)):
            if timeout is None and check in scheduler.periodic_callbacks:
                scheduler.periodic_callbacks[check].callback_time = 1000 * _CHECK_SECONDS


class QuietWorker(WorkerPlugin):
    """A worker whose timers all fire at once, every heartbeat (10 s), when it is idle:

    * its heartbeat and its search for missing data start at the scheduler's floor, in step
      with its other timers (a worker starts both at 1 s and learns the interval from its
      first heartbeat's reply, which puts each on a phase of its own);
    * its memory monitor (spill at 70 %, pause at 80 % of its memory limit) runs as often;
      the nanny's, in the flow's process, still restarts a worker past 95 % within the 2 s of
      ``QUIET_CONFIG``;
    * it has no event-loop check (``tick``, and its cycle): Dask's only output of it is an INFO
      log line when the loop stalled (its 3 s threshold is read at import, so a tick slower
      than 2 s would report stalls that did not happen), which a local cluster never prints
      (``silence_logs`` is ERROR) and nothing here reads. The flow's process keeps its tick;
    * it does not shift its counters every 5 s: they feed the worker's dashboard, which is off.

    With it, 16 idle workers and their scheduler and nannies used 0.75-0.83 % of one core
    (``bench/idle_cluster.py --workers 16 --seconds 60 --repeats 3``, machine otherwise idle).
    """

    name = "damptune-quiet"

    def __init__(self, *, heartbeat: float = HEARTBEAT_SECONDS) -> None:
        self.heartbeat = heartbeat

    def setup(self, worker: Any) -> None:
        timers = worker.periodic_callbacks
        ttl = parse_timedelta(dask.config.get("distributed.scheduler.worker-ttl", None))
        seconds = heartbeat_floor(self.heartbeat, ttl)  # what the scheduler will answer
        for name in ("heartbeat", "find-missing", "memory_monitor"):
            if name in timers:
                timers[name].callback_time = 1000 * seconds
        for name in WORKER_TIMERS_UNREAD:
            timer = timers.pop(name, None)
            if timer is not None:
                timer.stop()


# A local cluster's nannies run in the flow's process, on the scheduler's event loop: their system
# monitors sample the process that the scheduler's monitor samples, their ticks time the loop
# that the scheduler's tick times, and nothing reads either (a nanny sends no metrics and serves
# no dashboard). Stopping them: the flow's process 0.67 -> 0.50 and 0.93 -> 0.53 % of a core
# (two pairs of draws on a busy machine, samples every 5 s).
NANNY_TIMERS_UNREAD = ("monitor", "tick", "ticks", "shift_counters")


async def in_step(scheduler: Any, nannies: Iterable[Any]) -> None:
    """Stop the unread timers of ``nannies`` (:data:`NANNY_TIMERS_UNREAD`; each keeps its memory
    monitor), then restart the running timers of the scheduler and the nannies together, so
    that timers of one period fire in one wake-up of the process rather than one each. For a
    local cluster's scheduler and nannies, on their event loop."""
    nannies = list(nannies)
    for nanny in nannies:
        for name in NANNY_TIMERS_UNREAD:
            if name in nanny.periodic_callbacks:
                nanny.periodic_callbacks[name].stop()
    for server in (scheduler, *nannies):
        for timer in server.periodic_callbacks.values():
            if timer.is_running():
                timer.stop()
                timer.start()
