"""The engine measures its own orchestration overhead per update: fixed + per rank."""

import json
import subprocess
import sys

import pytest

from damptune.overhead import fit_overhead, overhead_of


def test_fit_recovers_a_line_and_never_goes_negative():
    fit = fit_overhead([(1, 0.012), (2, 0.015), (4, 0.021), (8, 0.033)])
    assert fit.fixed == pytest.approx(0.009) and fit.per_rank == pytest.approx(0.003)
    assert fit.seconds(16) == pytest.approx(0.009 + 16 * 0.003)
    flat = fit_overhead([(1, 0.010), (4, 0.004)])  # falling with P: no negative per-rank part
    assert flat.per_rank == 0.0 and flat.fixed >= 0.0
    assert fit_overhead([(4, 0.02)]).per_rank == 0.0


def test_overhead_of_a_history_uses_time_beyond_computing_and_skips_changes_of_p():
    history = []
    for p in (1, 2, 4):
        history.append({"kind": "update", "n_workers": p, "time_update": 1.0,  # a change of P
                        "time_compute": 0.0, "time_damper": 0.0})
        history += [{"kind": "update", "n_workers": p, "time_update": 0.005 + 0.001 * p + 0.002,
                     "time_compute": 0.002, "time_damper": 0.0}] * 5
        history.append({"kind": "eval", "test_accuracy": 0.5})
    fit = overhead_of(history)
    assert fit.fixed == pytest.approx(0.005) and fit.per_rank == pytest.approx(0.001)
    assert [p for p, _ in fit.points] == [1, 2, 4]
    assert overhead_of([{"kind": "eval"}]) is None


@pytest.mark.slow
def test_overhead_command_measures_each_p_on_a_cluster(scheduler):
    out = subprocess.run([sys.executable, "-m", "damptune", "overhead", "--ranks", "1,2",
                          "--updates", "10", "--mode", "centralized", "--scheduler", scheduler,
                          "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert [p["ranks"] for p in row["points"]] == [1, 2]
    assert all(p["ms"] > 0 for p in row["points"])  # an exchange and a step cost something
    assert row["overhead_ms"] >= 0 and row["overhead_per_rank_ms"] >= 0
    bad = subprocess.run([sys.executable, "-m", "damptune", "overhead", "--ranks", "0,x"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--ranks" in bad.stderr
