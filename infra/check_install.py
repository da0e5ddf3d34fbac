"""Check a non-editable install: ``pip install .`` into a fresh virtualenv, then ``damptune tune``
on a tiny grid from another directory must write its run directory there, not into the package.

What it does, each in a new temporary directory:

1. copies the checkout (without ``.git``, ``.venv``, ``runs``, caches) and makes a virtualenv;
   installs ``torch==2.13.0`` first, as ``make setup`` does (pip takes a local CPU wheel where
   its find-links has one), then ``pip install -c constraints.txt <copy>`` (not editable; the
   exact tested versions of constraints.txt), then deletes the copy;
2. from a second, empty directory, with none of this shell's ``PYTHONPATH``,
   ``PREFECT_API_URL`` or ``MLFLOW_TRACKING_URI`` (its own ``PREFECT_HOME`` and
   ``DAMPTUNE_CACHE``), runs the installed ``damptune tune`` on one cell (network 2,
   geodamp, mlp, 2 trials of 2 epochs, no held-out seeds);
3. checks: it exited 0; ``damptune`` and ``flows`` were imported from the virtualenv's
   site-packages; ``runs/<grid>/`` of that directory holds ``optuna.db``, ``mlflow.db`` and
   ``summary.md``; nothing of the run is under site-packages (no file of its names, nothing
   written there during the run but byte-code) or in the checkout.

It prints one line per check, then ``met`` or ``not met``; exit status 1 when not met (the
temporary directories are then kept, and named). Standard library only::

    python3 infra/check_install.py [--python PYTHON] [--keep]     # or: make check-install
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
GRID = "install-check"
SMOKE = ["--networks", "2", "--algorithms", "geodamp", "--models", "mlp", "--trials", "2",
         "--epochs", "2", "--target", "0.3", "--validation-seeds", "0", "--grid-name", GRID,
         "--no-progress"]
RUN_FILES = ("optuna.db", "mlflow.db", "summary.md")
NOT_COPIED = (".git", ".venv", "runs", "build", "*.egg-info", "__pycache__", ".*_cache",
              "dask-scratch-space")
# what would point the installed package back at this shell's checkout or servers
DROPPED_ENV = ("PYTHONPATH", "VIRTUAL_ENV", "PREFECT_API_URL", "PREFECT_HOME",
               "MLFLOW_TRACKING_URI", "DAMPTUNE_CACHE")
T0 = time.monotonic()


def _say(line: str) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s] {line}", flush=True)


def _run(cmd: list[str], *, cwd: Path, env: dict[str, str] | None = None,
         check: bool = True) -> subprocess.CompletedProcess[str]:
    _say("$ " + " ".join(cmd) + f"   (in {cwd})")
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        sys.exit(f"{cmd[0]} exited {done.returncode}:\n{(done.stdout + done.stderr)[-4000:]}\n"
                 "not met (the install failed)")
    return done


def install(base_python: str, box: Path) -> tuple[Path, Path]:
    """A virtualenv in ``box`` with the checkout installed (not editable); its python and
    site-packages."""
    src = box / "src"
    shutil.copytree(REPO_ROOT, src, ignore=shutil.ignore_patterns(*NOT_COPIED))
    _run([base_python, "-m", "venv", str(box / "venv")], cwd=box)
    python = box / "venv" / "bin" / "python"
    constraints = ["-c", str(src / "constraints.txt")]  # the exact tested versions
    _run([str(python), "-m", "pip", "install", "-q", *constraints, "torch==2.13.0"], cwd=box)
    _run([str(python), "-m", "pip", "install", "-q", *constraints, str(src)], cwd=box)
    shutil.rmtree(src)  # the installed package may not need the source it was built from
    site = _run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                cwd=box).stdout.strip()
    return python, Path(site)


def _clean_env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
    return {**env, "PREFECT_HOME": str(work / ".prefect"), "DAMPTUNE_CACHE": str(work / ".cache"),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true"}


def run_and_check(python: Path, site: Path, work: Path) -> list[tuple[bool, str]]:
    """``damptune tune`` of the install, run from ``work``; (passed, what) per check."""
    env, started = _clean_env(work), time.time()
    origin = _run([str(python), "-c", "import damptune, flows; print(damptune.__file__); "
                   "print(flows.__file__)"], cwd=work, env=env).stdout.split()
    tune = _run([str(python.parent / "damptune"), "tune", *SMOKE], cwd=work, env=env,
                check=False)
    print((tune.stdout + tune.stderr)[-1500:].rstrip())
    run_dir = work / "runs" / GRID
    strays = [str(p) for p in site.rglob("*") if p.name in (*RUN_FILES, GRID)
              or ("__pycache__" not in p.parts and p.lstat().st_mtime > started)]
    return [
        (tune.returncode == 0, f"damptune tune exited {tune.returncode}"),
        (all(Path(f).is_relative_to(site) for f in origin),
         f"damptune and flows imported from site-packages: {', '.join(origin)}"),
        *((run_dir.joinpath(name).is_file(), f"{run_dir / name} written")
          for name in RUN_FILES),
        (not strays, f"nothing of the run under {site}" + (f": {strays}" if strays else "")),
        (not (REPO_ROOT / "runs" / GRID).exists(), f"nothing of the run in {REPO_ROOT}/runs"),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter of the new virtualenv (default: this one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories")
    args = parser.parse_args(argv)
    box = Path(tempfile.mkdtemp(prefix="damptune-install-"))
    work = Path(tempfile.mkdtemp(prefix="damptune-run-"))
    python, site = install(args.python, box)
    _say(f"installed into {site}")
    results = run_and_check(python, site, work)
    for passed, what in results:
        print(f"{'ok    ' if passed else 'FAILED'} {what}")
    met = all(passed for passed, _ in results)
    if met and not args.keep:
        shutil.rmtree(box, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept: {box} (virtualenv), {work} (run)")
    _say("met" if met else "not met")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
