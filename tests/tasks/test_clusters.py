"""The worker pool is the live cluster (a real LocalCluster of its own: workers are killed,
replaced and added here)."""

import os
import signal
import threading
import time

import pytest
from distributed import Client

from damptune import ClusterError
from damptune.cluster import local_cluster
from tasks.clusters import open_cluster

pytestmark = pytest.mark.slow


def wait_until(condition, what, timeout=120.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def cluster(tmp_path):
    cluster = local_cluster(n_workers=3, local_directory=str(tmp_path / "dask"))
    yield cluster
    cluster.close()


@pytest.fixture
def pool(cluster, tmp_path):
    with open_cluster(cluster.scheduler_address, n_workers=3, worker_wait=60.0,
                      local_directory=str(tmp_path)) as pool:
        yield pool


def test_gangs_are_all_or_nothing_and_a_waiting_trial_holds_none(pool):
    outcome = []

    def second():
        try:
            with pool.acquire(2) as gang:
                outcome.append(list(gang.addresses))
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    with pool.acquire(2) as first:
        assert len(first.addresses) == 2
        t = threading.Thread(target=second)
        t.start()
        wait_until(lambda: pool.waiting == 1, "the second trial to wait")
        assert outcome == []  # 1 free worker is not enough: it waits, holding none
        with pool.acquire(1) as third:  # the free one is not held by the waiting trial
            assert set(third.addresses).isdisjoint(first.addresses)
    t.join(60)
    assert not t.is_alive() and len(outcome) == 1 and len(outcome[0]) == 2, outcome


def test_a_dead_worker_is_never_handed_out_and_its_replacement_is(pool):
    with Client(pool.address, timeout="10s") as client:
        before = sorted(client.scheduler_info(n_workers=-1)["workers"])
        victim = before[0]
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)  # its nanny starts a replacement at a new address
        wait_until(lambda: victim not in pool.live() and len(pool.live()) == 3,
                   "the replacement to join")
    with pool.acquire(3) as gang:
        assert victim not in gang.addresses
        assert len(set(gang.addresses) - set(before)) == 1  # the replacement


def test_workers_that_join_are_used_and_the_wait_names_the_counts(pool, cluster):
    counts = r"cluster at tcp://127\.0\.0\.1:\d+ has 3 live worker\(s\), 0 of them held .* needs 4"
    with pytest.raises(ClusterError, match=counts), pool.acquire(4, timeout=1.0):
        pass
    cluster.scale(4)  # e.g. an adaptive cluster growing: the waiting trial gets it
    with pool.acquire(4, timeout=120.0) as gang:
        assert len(gang.addresses) == 4


def test_a_gang_replaces_a_lost_worker_from_free_ones_not_from_other_trials(pool):
    with pool.acquire(1) as other, pool.acquire(1) as gang:
        lost = gang.addresses[0]
        replaced = gang.replace({lost}, need=1, timeout=10.0)
        assert lost not in replaced and len(replaced) == 1
        assert not set(replaced) & set(other.addresses)
        assert lost not in pool._held  # the lost one is given back to the pool
        with pytest.raises(ClusterError, match="needs 1 more"):
            gang.replace(set(replaced), need=1, timeout=0.5)  # no free worker is left


def test_a_cluster_that_never_offers_its_workers_is_a_cluster_error(tmp_path, cluster):
    with (pytest.raises(ClusterError, match=r"offered 3 of the 5 workers the grid needs"),
          open_cluster(cluster.scheduler_address, n_workers=5, wait_timeout=1.0,
                       local_directory=str(tmp_path))):
        pass


def test_trials_taking_workers_while_the_cluster_changes_never_hang(pool, cluster):
    """Membership events (handled on the client's event loop) arrive while trials take and
    give back workers from other threads: every trial thread finishes all its rounds (a pool
    that asked the scheduler while holding its lock deadlocked here, with the event loop
    waiting for that lock)."""
    stop, rounds, errors = threading.Event(), [0, 0, 0], []

    def trial(i):
        try:
            while not stop.is_set():
                with pool.acquire(1, timeout=60.0):
                    rounds[i] += 1
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    threads = [threading.Thread(target=trial, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    try:
        for size in (4, 3, 4, 3):  # each scale adds or removes a worker: events on the loop
            cluster.scale(size)
            wait_until(lambda s=size: len(pool.live()) == s, f"{size} workers", timeout=60)
    finally:
        stop.set()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a trial hung taking workers"
    assert errors == [] and all(n > 0 for n in rounds), (errors, rounds)


def test_two_runs_sharing_a_scheduler_never_hold_the_same_worker(pool, cluster, tmp_path):
    """Two flow runs (two pools, two clients) on one scheduler: a worker one run's trial holds
    is never given to the other's; the other waits for it, and gets it when it is given back
    or when the first run's client disconnects (a killed flow process)."""
    with open_cluster(cluster.scheduler_address, n_workers=3, worker_wait=60.0,
                      local_directory=str(tmp_path / "b")) as other:
        with pool.acquire(2) as first:
            with other.acquire(1) as second:  # the one worker the first run does not hold
                assert set(second.addresses).isdisjoint(first.addresses)
            with pytest.raises(ClusterError, match="2 by other runs"), other.acquire(2, timeout=1):
                pass
            got: list[list[str]] = []
            t = threading.Thread(target=lambda: got.append(other.take(3, timeout=60)))
            t.start()
            wait_until(lambda: other.waiting == 1, "the other run to wait")
        t.join(60)  # the first run gave its workers back: the other run gets all three
        assert not t.is_alive() and len(got) == 1 and len(got[0]) == 3, got
        other.give_back(got[0])
        with open_cluster(cluster.scheduler_address, n_workers=3,
                          local_directory=str(tmp_path / "c")) as doomed:
            held = doomed.take(3)
            assert len(held) == 3
            with pytest.raises(ClusterError, match="3 by other runs"):
                other.take(1, timeout=1)
        # `doomed`'s client closed without giving its workers back: its claims ended with it
        with other.acquire(3, timeout=30) as gang:
            assert sorted(gang.addresses) == sorted(held)
