"""damptune.cluster.local_cluster: workers forked from a server that imported what ranks need."""

import os
import sys

from distributed import Client

from damptune.cluster import FORKSERVER_PRELOAD, local_cluster


def _worker_facts() -> dict:
    import psutil

    return {"preloaded": sorted(m for m in ("torch", "torch._dynamo", "damptune.ranks")
                                if m in sys.modules),
            "parent": " ".join(psutil.Process(os.getppid()).cmdline()),
            "threads": os.environ.get("OMP_NUM_THREADS")}


def test_workers_start_with_torch_and_the_engine_imported(tmp_path):
    """A local cluster's worker is a fork of one server process that has imported torch,
    torch._dynamo (which torch.optim imports at its first step) and the engine: it pays none
    of those imports (~5 s of CPU each when every worker is a fresh interpreter). It still
    gets Dask's single-threaded environment (OMP_NUM_THREADS=1)."""
    assert {"torch", "torch._dynamo", "damptune.ranks"} <= set(FORKSERVER_PRELOAD)
    cluster = local_cluster(n_workers=2, local_directory=str(tmp_path / "dask"))
    try:
        with Client(cluster, set_as_default=False) as client:
            facts = client.run(_worker_facts)
    finally:
        cluster.close()
    assert len(facts) == 2, facts
    for fact in facts.values():
        assert fact["preloaded"] == ["damptune.ranks", "torch", "torch._dynamo"], fact
        assert "forkserver" in fact["parent"], fact
        assert fact["threads"] == "1", fact
