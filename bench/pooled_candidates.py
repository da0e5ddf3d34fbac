"""Would the answer be steadier if each cell also retrained its algorithm's bests of the other
network sizes? An experiment on a copy of a finished grid (issue 24; not what the flow does).

Each validation cell retrains its search's best (and near miss, and runner-ups) on the grid's
held-out seeds. This copies a finished grid's run directory (``--from``: its ``optuna.db``,
by SQLite's backup, ``grid.json`` and ``checkpoints``) to ``--to``, and there enqueues in each
validation cell, on the same held-out seeds, the best configuration of every other network
size's search of the same algorithm and model that the cell does not retrain yet (a matched
cell is left as it is). The cell's answer is then, as ever, the configuration of least mean
time among those that reached the target on most seeds (``tasks.validation``).

It trains nothing: rerun the grid's own command with ``--run-dir`` set to the copy (for
example ``damptune tune --models mlp --mode local --seed 0 --grid-name G --run-dir COPY
--no-progress``); the rerun reuses every finished trial and trains only the enqueued ones.
Then compare with ``bench/answer_stability.py`` and ``bench/answer_spread.py``, and count
the held-out trial seconds with ``bench/grid_trials.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import optuna  # noqa: E402

from tasks.search import best_trial  # noqa: E402

# the validation module's own helpers and attribute (not its API: an experiment on its data)
from tasks.validation import _CANDIDATES, SEEDED, _candidates, _enqueue  # noqa: E402


def copy_grid(source: str, target: str) -> str:
    """Copy the grid's store (SQLite backup: consistent even beside a WAL file), its
    ``grid.json`` (paths rewritten to the copy) and checkpoints; the copy's storage URL."""
    if os.path.exists(target):
        raise SystemExit(f"--to: {target!r} exists; give a directory that does not")
    os.makedirs(target)
    src = sqlite3.connect(os.path.join(source, "optuna.db"))
    dst = sqlite3.connect(os.path.join(target, "optuna.db"))
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    with open(os.path.join(source, "grid.json")) as f:
        meta = json.load(f)
    meta = {k: v.replace(os.path.abspath(source), os.path.abspath(target))
            if isinstance(v, str) else v for k, v in meta.items()}
    with open(os.path.join(target, "grid.json"), "w") as f:
        json.dump(meta, f, indent=1)
    if os.path.isdir(os.path.join(source, "checkpoints")):
        shutil.copytree(os.path.join(source, "checkpoints"), os.path.join(target, "checkpoints"))
    return f"sqlite:///{os.path.abspath(target)}/optuna.db"


def pool(storage: str) -> tuple[int, int]:
    """Enqueue the other sizes' search bests in every validation cell; (cells, configurations
    added)."""
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    searches = {n: optuna.load_study(study_name=n, storage=storage).get_trials(deepcopy=False)
                for n in names if n.count("/") == 3}  # <grid>/n<P>/<algorithm>/<model>
    bests = {n: best for n, trials in sorted(searches.items())
             if (best := best_trial(trials)) is not None}
    cells = added = 0
    for name in (n for n in names if n.endswith("/validation")):
        study = optuna.load_study(study_name=name, storage=storage)
        grid, network, algorithm, model, _ = name.split("/")
        seeds = list(study.user_attrs.get(SEEDED) or [])
        if not seeds:  # its search had no best: nothing was retrained
            continue
        tried = _candidates(study)
        have = [searches[f"{grid}/{cell}"][int(number)].params
                for cell, _, number in (n.partition("#") for n in tried)
                if f"{grid}/{cell}" in searches]
        for other, best in bests.items():
            _, net, alg, mod = other.split("/")
            if (alg, mod) != (algorithm, model) or net == network or best.params in have:
                continue
            tag = f"{net}/{alg}/{mod}#{best.number}"
            _enqueue(study, best, seeds, tag)
            tried, have, added = [*tried, tag], [*have, best.params], added + 1
        study.set_user_attr(_CANDIDATES, tried)
        cells += 1
    return cells, added


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", required=True,
                        help="a finished grid's run directory (read only)")
    parser.add_argument("--to", required=True, help="the copy's directory (must not exist)")
    args = parser.parse_args(argv)
    if not os.path.exists(os.path.join(args.source, "optuna.db")):
        parser.error(f"--from: {args.source!r} has no optuna.db; expected a grid's run "
                     "directory")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    cells, added = pool(copy_grid(args.source, args.to))
    print(f"{args.to}: {added} configurations enqueued in {cells} validation cells; rerun the "
          f"grid's command with --run-dir {args.to} to train them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
