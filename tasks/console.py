"""Keep a flow run alive when nobody reads its console any more.

A flow run started by a Prefect worker writes its stdout and stderr into pipes that the worker
reads. When the worker dies (SIGKILL, the OOM killer, a restarted container) those pipes lose
their reader, and the next write fails with EPIPE. Prefect's console log handler prints through
a rich ``Console``, which answers a broken pipe by raising ``SystemExit(1)`` in whichever
thread logged. When that thread was the Dask scheduler's event loop, the scheduler stopped
answering: the flow run stayed RUNNING, idle, holding its deployment's concurrency slot, and
the next run of the deployment waited for that slot for ever. A terminal or a ``| tee`` that
goes away does the same to ``damptune tune``.

``with keep_running_without_console(on_detach):`` makes losing the console harmless:

* a watchdog thread polls the process's stdout and stderr; a pipe or socket whose reader is
  gone reports POLLERR/POLLHUP, and the watchdog points that file descriptor at /dev/null (so
  Python, C code and child processes started later all write there without error);
* rich consoles attached to logging handlers go quiet on a broken pipe instead of raising
  ``SystemExit``, which covers a write that fails before the watchdog looks (rich documents
  ``on_broken_pipe`` as the method to override);
* ``on_detach`` is told once, so the run can say so through the channels it still has (the
  Prefect API's log, MLflow).

The run goes on: its logs still reach the Prefect API, its metrics MLflow, its trials Optuna.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import stat
import threading
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["keep_running_without_console", "console_detached", "reader_gone"]

_FDS = {1: "stdout", 2: "stderr"}
_lock = threading.Lock()
_detached: set[int] = set()
_listeners: list[Callable[[str], None]] = []
_watchdog: threading.Thread | None = None
_told = threading.Event()  # the listeners heard of the console's loss (they hear it once)


def reader_gone(fd: int) -> bool:
    """Whether ``fd`` is a pipe or socket that nobody reads any more."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    if not (stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)):
        return False  # a terminal, a file or /dev/null
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))


def console_detached() -> list[str]:
    """Names of the standard streams that were pointed at /dev/null (empty when none)."""
    with _lock:
        return [_FDS[fd] for fd in sorted(_detached)]


def _detach_broken() -> None:
    newly = []
    with _lock:
        for fd in _FDS:
            if fd not in _detached and reader_gone(fd):
                devnull = os.open(os.devnull, os.O_WRONLY)
                try:
                    os.dup2(devnull, fd)
                finally:
                    os.close(devnull)
                _detached.add(fd)
                newly.append(_FDS[fd])
        # stdout and stderr lose their reader one after the other: the first loss is news
        first = bool(newly) and not _told.is_set()
        if first:
            _told.set()
        listeners = list(_listeners)
    if first:
        message = (f"the console of this process is gone ({', '.join(newly)} had no reader: "
                   "its Prefect worker or terminal died); it goes on with its output in "
                   "/dev/null, logging to the Prefect API, MLflow and Optuna")
        for notify in listeners:
            with contextlib.suppress(Exception):  # a listener must not stop the others
                notify(message)


def _quiet_on_broken_pipe(console: Any) -> Callable[[], None]:
    def on_broken_pipe() -> None:
        console.quiet = True  # what rich does, minus SystemExit
        _detach_broken()
    return on_broken_pipe


def _guard_rich_consoles() -> None:
    loggers = [logging.getLogger()] + [
        lg for lg in list(logging.Logger.manager.loggerDict.values())
        if isinstance(lg, logging.Logger)]
    for lg in loggers:
        for handler in list(lg.handlers):
            console = getattr(handler, "console", None)
            if (console is not None and hasattr(console, "on_broken_pipe")
                    and not getattr(console, "_damptune_guarded", False)):
                console.on_broken_pipe = _quiet_on_broken_pipe(console)
                console._damptune_guarded = True


def _watch(interval: float) -> None:
    while True:
        _detach_broken()
        with _lock:
            if len(_detached) == len(_FDS):
                return  # nothing left to watch
        threading.Event().wait(interval)


@contextlib.contextmanager
def keep_running_without_console(on_detach: Callable[[str], None] | None = None, *,
                                 interval: float = 0.2) -> Iterator[None]:
    """Within the block, this process survives the loss of its console (see the module doc).

    ``on_detach(message)`` is called if a stream is detached while the block runs. The
    watchdog is process-wide and outlives the block (a lost console stays lost).
    """
    global _watchdog
    _guard_rich_consoles()
    with _lock:
        if on_detach is not None:
            _listeners.append(on_detach)
        if _watchdog is None or not _watchdog.is_alive():
            _watchdog = threading.Thread(target=_watch, args=(interval,), daemon=True,
                                         name="damptune-console-watchdog")
            _watchdog.start()
    try:
        yield
    finally:
        with _lock:
            if on_detach is not None:
                _listeners.remove(on_detach)
