"""damptune's own log lines reach the flow run's logs in Prefect (what the UI shows): a flow
run started with the environment prefect.yaml's work pool gives its runs, whose engine warns
(an unreadable checkpoint generation skipped), has that warning in Prefect's logs."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from infra.prefect_api import client

REPO_ROOT = Path(__file__).resolve().parents[2]

FLOW = textwrap.dedent("""
    import sys
    from prefect import flow

    from damptune.checkpoint import load_latest

    @flow(name="logs-check")
    def check(path: str) -> bool:
        return load_latest(path, keep=2) is not None

    state = check(sys.argv[1], return_state=True)
    print(state.state_details.flow_run_id)
""")


def _work_pool_env() -> dict[str, str]:
    shipped = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    return shipped["definitions"]["work_pool"]["job_variables"]["env"]


def test_engine_warnings_reach_the_flow_runs_logs_in_prefect(tmp_path, prefect_harness):
    import torch

    from damptune.checkpoint import checkpoint_paths, save_checkpoint

    newest, older = checkpoint_paths(str(tmp_path / "ckpt.pt"), 2)
    save_checkpoint(older, {"step": 1})
    Path(newest).write_bytes(b"not a checkpoint")  # a torn write of the newest generation
    assert torch.load(older, weights_only=True) == {"step": 1}
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_LOGGING_")}
    env.update(_work_pool_env(), PREFECT_API_URL=prefect_harness)  # as the worker's runs get
    done = subprocess.run([sys.executable, "-c", FLOW, str(tmp_path / "ckpt.pt")], env=env,
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = done.stdout.strip().splitlines()[-1]
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with client(prefect_harness) as c:
        logs = c.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    lines = {(log.name, log.message) for log in logs}
    assert any(name == "damptune.checkpoint" and "skipping an unreadable checkpoint" in msg
               for name, msg in lines), sorted(lines)
    assert any(name == "damptune.checkpoint" and "resuming from the older checkpoint" in msg
               for name, msg in lines), sorted(lines)
