"""damptune.cluster.local_cluster: workers forked from a server that imported what ranks need
(and what the main module imports); an idle cluster's slowed heartbeat still lets the
scheduler notice a killed worker at once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from distributed import Client

from damptune.cluster import local_cluster
from damptune.quiet import HEARTBEAT_SECONDS


def test_workers_start_with_torch_and_the_engine_imported(tmp_path):
    """A local cluster's worker is a fork of one server process that has imported torch,
    torch._dynamo (which torch.optim imports at its first step) and the engine: it pays none
    of those imports (~5 s of CPU each when every worker is a fresh interpreter). It still
    gets Dask's single-threaded environment (OMP_NUM_THREADS=1)."""
    def worker_facts() -> dict:  # a closure: sent by value, it imports nothing of this file
        import psutil

        return {"preloaded": sorted(m for m in ("torch", "torch._dynamo", "damptune.ranks")
                                    if m in sys.modules),
                "parent": " ".join(psutil.Process(os.getppid()).cmdline()),
                "threads": os.environ.get("OMP_NUM_THREADS")}

    cluster = local_cluster(n_workers=2, local_directory=str(tmp_path / "dask"))
    try:
        with Client(cluster, set_as_default=False) as client:
            facts = client.run(worker_facts)
    finally:
        cluster.close()
    assert len(facts) == 2, facts
    for fact in facts.values():
        assert fact["preloaded"] == ["damptune.ranks", "torch", "torch._dynamo"], fact
        assert "forkserver" in fact["parent"], fact
        assert fact["threads"] == "1", fact


def _heartbeat_seconds(dask_worker) -> float:
    return dask_worker.periodic_callbacks["heartbeat"].callback_time / 1000


def _removal(client: Client, worker: str) -> dict | None:
    """The scheduler's ``remove-worker`` event of ``worker``, if it has logged one."""
    for _, event in client.get_events("all"):
        if isinstance(event, dict) and event.get("action") == "remove-worker" \
                and event.get("worker") == worker:
            return event
    return None


def test_a_killed_worker_leaves_the_scheduler_by_its_closed_connection(tmp_path):
    """Workers heartbeat every HEARTBEAT_SECONDS (10 s), not Dask's 0.5 s for a small cluster,
    yet a SIGKILLed worker is removed because its connection closed (Dask's stimulus
    ``handle-worker-cleanup``), not after missed heartbeats (``check-worker-ttl``)."""
    cluster = local_cluster(n_workers=2, local_directory=str(tmp_path / "dask"))
    try:
        with Client(cluster, set_as_default=False) as client:
            assert set(client.run(_heartbeat_seconds).values()) == {HEARTBEAT_SECONDS}
            pids = client.run(os.getpid)
            victim = sorted(pids)[0]
            os.kill(pids[victim], signal.SIGKILL)
            deadline = time.monotonic() + 120  # a hang guard, far below Dask's 300 s TTL
            while (event := _removal(client, victim)) is None:
                assert time.monotonic() < deadline, "the killed worker was never removed"
                time.sleep(0.05)
            assert event["stimulus_id"].startswith("handle-worker-cleanup"), event
            assert victim not in client.scheduler_info(n_workers=-1)["workers"]
    finally:
        cluster.close()


REPO_ROOT = Path(__file__).resolve().parents[2]
# a flow run started as `python -m prefect.engine`, in miniature: a main module run by name,
# whose import of a module (Prefect's, there) records the process that executed it
DEPENDENCY = """import os
with open(os.environ["IMPORTED_IN"], "a") as f:
    f.write(f"{os.getpid()}\\n")
"""
MAIN = """import json, os
import heavy_dependency  # noqa: F401
if __name__ == "__main__":
    from distributed import Client
    from damptune.cluster import local_cluster
    cluster = local_cluster(n_workers=2, local_directory=os.environ["DASK_DIR"])
    with Client(cluster, set_as_default=False) as client:
        print(json.dumps(sorted(client.run(os.getpid).values())))
    cluster.close()
"""


def test_workers_of_a_main_module_run_by_name_do_not_import_its_imports_again(tmp_path):
    """multiprocessing runs the main module again in every worker it starts (as
    ``__mp_main__``); started by name, the forkserver imports it once, so its imports (all of
    Prefect for a flow run, ~2.4 s of CPU each) are done before the fork: the modules it
    imports execute in this process and the forkserver, in no worker."""
    (tmp_path / "heavy_dependency.py").write_text(DEPENDENCY)
    (tmp_path / "cluster_main.py").write_text(MAIN)
    record = tmp_path / "imported-in.txt"
    env = {**os.environ, "IMPORTED_IN": str(record), "DASK_DIR": str(tmp_path / "dask"),
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "cluster_main"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    workers = json.loads(done.stdout.strip().splitlines()[-1])
    importers = [int(line) for line in record.read_text().split()]
    assert len(workers) == 2, done.stdout
    assert not set(workers) & set(importers), (workers, importers)
    assert len(importers) == 2, importers  # the main process and the forkserver
