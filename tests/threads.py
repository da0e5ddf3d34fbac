"""Run functions in threads and see how each one ended: an exception raised in a thread is kept
(not lost with the thread), and a thread still running after the timeout says so."""

import threading
import time
import traceback
from collections.abc import Callable

JOIN_SECONDS = 120.0  # for all the threads together; a thread still alive then is a hang
OK = "ok"


def run_in_threads(targets: list[Callable[[], object]], *,
                   timeout: float = JOIN_SECONDS) -> list[str]:
    """Run each target in its own thread and join them all within ``timeout`` seconds.

    Returns one outcome per target, in order: ``OK`` if it returned, the traceback if it
    raised, ``"still running ..."`` if its thread had not ended by the deadline.
    """
    outcomes: list[str | None] = [None] * len(targets)

    def guarded(i: int) -> None:
        try:
            targets[i]()
            outcomes[i] = OK
        except BaseException:  # noqa: BLE001 - every failure is reported to the test
            outcomes[i] = traceback.format_exc()

    threads = [threading.Thread(target=guarded, args=(i,), name=f"target-{i}", daemon=True)
               for i in range(len(targets))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    return [f"still running after {timeout:g} s" if t.is_alive() else str(outcome)
            for t, outcome in zip(threads, list(outcomes), strict=True)]
