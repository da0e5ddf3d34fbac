"""`python -m bench`: the list of maintained benches, and the time wrapper's records."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench import catalog, records


def _bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=records.ROOT,
                          env=env, capture_output=True, text=True, timeout=120)


def test_main_list_shows_every_maintained_bench_and_at_most_15():
    out = _bench("list")
    assert out.returncode == 0, out.stderr
    listed = [line.split()[0] for line in out.stdout.split("\n\n")[0].splitlines()]
    assert listed == list(catalog.BENCHES)
    assert len(listed) <= catalog.MAX_BENCHES
    scripts = {p.stem for p in catalog.BENCH_DIR.glob("*.py")}
    helpers = {"__init__", "__main__", "catalog", "records", "report", "resizes"}
    assert scripts - helpers == set(catalog.BENCHES)  # no script left that is not maintained
    for name in catalog.BENCHES:
        assert catalog.question(name).endswith("?"), name
        assert catalog.goal(name).startswith("Goal"), name


def test_main_time_records_the_exit_status_and_seconds(tmp_path):
    env = {**os.environ, records.RESULTS_ENV: str(tmp_path)}
    env.pop(records.NO_RECORD_ENV, None)
    command = [sys.executable, "-c", "import sys, time; time.sleep(0.5); sys.exit(3)"]
    out = _bench("time", "exit-three", "--goal-s", "60", "--", *command, env=env)
    assert out.returncode == 3, out.stderr  # the command's own status
    record = json.loads((tmp_path / "exit-three.jsonl").read_text())
    assert record["figures"]["exit_status"] == 3
    assert isinstance(record["figures"]["wall_s"], float)  # recorded; its size is no test's
    assert record["goal"] == "wall <= 60 s, exit status 0"
    assert record["verdict"] == "not met"  # a failed command meets no time goal
    assert record["command"][-len(command):] == command
