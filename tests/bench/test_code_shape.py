"""A real bench run (code_shape, the cheapest) writes one well-formed record."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench import records


def test_code_shape_run_appends_a_well_formed_record(tmp_path):
    env = {**os.environ, records.RESULTS_ENV: str(tmp_path)}
    env.pop(records.NO_RECORD_ENV, None)
    for _ in range(2):
        subprocess.run([sys.executable, "-m", "bench", "code_shape"], cwd=records.ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    lines = (tmp_path / "code_shape.jsonl").read_text().splitlines()
    assert len(lines) == 2  # appended, one line per run
    record = json.loads(lines[-1])
    assert record["bench"] == "code_shape"
    assert record["command"] == ["python", "-m", "bench", "code_shape"]
    assert len(record["commit"]) == 40 and isinstance(record["dirty"], bool)
    assert record["product"] == records.current_product()
    assert record["date"].endswith("+00:00")
    machine = record["machine"]
    assert machine["cores"] >= 1 and machine["cpu"] and 0 < machine["pace_s"] < 60
    assert isinstance(record["figures"]["over_limit"], int)
    assert isinstance(record["goal"], list) and len(record["goal"]) == 3
    assert set(record["verdict"]) == set(record["goal"])
    assert set(record["verdict"].values()) <= {"met", "not met", "not measured"}


def test_code_shape_no_record_writes_nothing(tmp_path):
    env = {**os.environ, records.RESULTS_ENV: str(tmp_path)}
    out = subprocess.run([sys.executable, "bench/code_shape.py", "--no-record"],
                         cwd=records.ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "functions over 60 lines" in out.stdout, out.stderr
    assert not list(tmp_path.iterdir())
