import json
import subprocess
import sys

import pytest


def run(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "damptune", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_cli_train_prints_json_summary():
    out = run("train", "--model", "mlp", "--dataset", "synthetic", "--damper", "geodamp",
              "--param", "factor=2", "--param", "delay=1", "--initial", "16", "--epochs", "2",
              "--mode", "local", "--json", "--no-progress")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["test_accuracy"] > 0.5
    assert summary["epochs"] == pytest.approx(2)
    assert summary["final_batch_size"] == 32


def test_cli_train_decentralized_on_existing_scheduler(scheduler, tmp_path):
    ckpt = tmp_path / "c.pt"
    out = run("train", "--model", "cnn", "--dataset", "mnist1d", "--damper", "geodamp",
              "--param", "delay=1", "--epochs", "2", "--workers", "2", "--per-worker-batch",
              "32", "--mode", "decentralized", "--scheduler", scheduler, "--checkpoint",
              str(ckpt))
    assert out.returncode == 0, out.stderr
    assert "test accuracy" in out.stdout and "updates" in out.stdout
    assert "ex/s" in out.stderr or "%" in out.stderr  # the progress bar
    assert ckpt.exists()


def test_cli_unknown_model_is_a_clear_error():
    out = run("train", "--model", "resnet9000", "--dataset", "synthetic", "--no-progress")
    assert out.returncode == 2
    assert "resnet9000" in out.stderr and "mlp" in out.stderr
    assert "Traceback" not in out.stderr


def test_cli_version_prints_the_installed_package_version():
    from importlib.metadata import version

    out = run("--version", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"damptune {version('damptune')}"
