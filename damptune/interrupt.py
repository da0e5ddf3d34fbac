"""Stop requests: a SIGTERM (or a run's first Ctrl-C), a deadline (a cluster's lifetime), or
the caller.

Training checks :func:`requested` between updates (distributed modes: between segments, about
every second); it then checkpoints and returns *interrupted*, which is not a failure: a rerun
continues from that checkpoint.

Example:
    >>> from damptune import interrupt
    >>> interrupt.request("spot reclaim notice")
    >>> interrupt.requested()
    'spot reclaim notice'
    >>> interrupt.clear()
"""

from __future__ import annotations

import math
import signal
import threading
import time
from typing import Any

__all__ = ["request", "requested", "clear", "install_sigterm_handler", "install_sigint_handler",
           "active", "parse_duration", "own_process"]

# a SIGTERM handler is process-wide, so the request it records is too
_EVENT = threading.Event()
_REASON = [""]
_ACTIVE: set[int] = set()  # threads with a training in progress
_LOCK = threading.Lock()


def request(reason: str) -> None:
    """Ask every training in this process to checkpoint and stop."""
    _REASON[0] = reason
    _EVENT.set()


def requested() -> str | None:
    return _REASON[0] if _EVENT.is_set() else None


def clear() -> None:
    _EVENT.clear()
    _REASON[0] = ""


class active:  # noqa: N801 - used as a context manager, like a function
    """Counts a training in progress (the SIGTERM handler waits for them to checkpoint)."""

    def __enter__(self) -> active:
        with _LOCK:
            _ACTIVE.add(threading.get_ident())
        return self

    def __exit__(self, *exc: Any) -> None:
        with _LOCK:
            _ACTIVE.discard(threading.get_ident())


_OWN_PROCESS = False  # set by a program that is the run (damptune tune): SIGTERM never re-raised


def own_process() -> None:
    """This process is the run (``damptune tune``): from now on, a SIGTERM handler installed
    here only requests the stop; the run checkpoints and ends interrupted, and the program
    exits with its own status, instead of a handler installed before (Prefect's) aborting it."""
    global _OWN_PROCESS
    _OWN_PROCESS = True


def install_sigterm_handler(*, grace: float = 60.0, reraise: bool | None = None) -> bool:
    """On SIGTERM: request a stop. If the main thread itself trains, it checkpoints and returns
    *interrupted* (the program then ends normally). If trainings run in other threads (Prefect
    tasks), wait up to ``grace`` s for them to checkpoint, then hand the signal to the previous
    handler (Prefect's), unless ``reraise`` is False (default: False after :func:`own_process`,
    else True): the program then goes on, and ends as an interrupted run does. Only from the
    main thread; returns whether installed."""
    if reraise is None:
        reraise = not _OWN_PROCESS
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGTERM) if reraise else signal.SIG_IGN

    def handler(signum: int, frame: Any) -> None:
        request("SIGTERM")
        if threading.get_ident() in _ACTIVE or not reraise:
            return  # the training in this thread sees the request after its current update
        deadline = time.monotonic() + grace
        while _ACTIVE and time.monotonic() < deadline:
            time.sleep(0.1)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.raise_signal(signal.SIGTERM)

    signal.signal(signal.SIGTERM, handler)
    return True


def install_sigint_handler(say: Any = None) -> bool:
    """A program that is the run (``damptune tune``): the first Ctrl-C (SIGINT) asks the stop,
    as a SIGTERM does (the trials checkpoint, the run ends interrupted, a rerun continues it);
    the next one aborts at once (KeyboardInterrupt). ``say(message)`` tells the user. Only
    from the main thread, and not where SIGINT is ignored (a background job of a shell
    without job control); returns whether installed."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return False

    def handler(signum: int, frame: Any) -> None:
        request("SIGINT (Ctrl-C)")
        signal.signal(signal.SIGINT, signal.default_int_handler)  # the next one aborts
        if say is not None:
            say("stopping: the trials checkpoint, then the run ends (a rerun continues it); "
                "Ctrl-C again to abort at once")

    signal.signal(signal.SIGINT, handler)
    return True


def parse_duration(text: str | float | int | None) -> float | None:
    """``"6h"``, ``"90m"``, ``"45s"``, ``"1d"`` or seconds → seconds (None stays None)."""
    if text is None or text == "":
        return None
    if isinstance(text, int | float) and not isinstance(text, bool):
        value = float(text)
    else:
        units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
        t = str(text).strip().lower()
        try:
            value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
        except (ValueError, KeyError):
            value = -1.0
    if not 0 < value < math.inf:  # nan, zero, negative and endless are no lifetime
        from damptune.errors import ConfigError

        raise ConfigError("max_cluster_lifetime", text, "a duration such as '6h', '90m', '3600'")
    return value
