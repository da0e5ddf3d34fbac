"""``python -m bench``: list the benches, run one, time a command, render the report.

    python -m bench list                          # name, question, goal of each bench
    python -m bench NAME [ARGS...] [--no-record]  # run bench/NAME.py, which writes a record
    python -m bench time NAME -- COMMAND...       # time COMMAND, record wall seconds and status
    python -m bench report [--check]              # render docs/benchmarks.md from the records
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from bench import catalog, records, report


def list_benches() -> int:
    width = max(len(name) for name in catalog.BENCHES)
    for name in catalog.BENCHES:
        print(f"{name:<{width}}  {catalog.question(name)}  [{catalog.goal(name)}]")
    print("\ntimed commands (python -m bench time NAME -- COMMAND):")
    for name, (question, seconds) in sorted(catalog.TIMED.items()):
        print(f"{name:<{width}}  {question}  [Goal: wall <= {seconds:g} s]")
    return 0


def run_bench(name: str, args: list[str]) -> int:
    """Run ``bench/NAME.py`` as its own process (as ``python bench/NAME.py`` does), with the
    command as typed here for its record."""
    path = catalog.path_of(name)
    env = dict(os.environ)
    env[records.COMMAND_ENV] = json.dumps(["python", "-m", "bench", name, *args])
    return subprocess.call([sys.executable, str(path), *args], env=env)


def time_command(args: list[str]) -> int:
    """``time NAME [--goal-s S] -- COMMAND...``: run COMMAND, record its wall seconds and exit
    status against NAME's goal (catalog.TIMED, or ``--goal-s``); exit with its status."""
    if "--" not in args or args.index("--") == 0 or args.index("--") == len(args) - 1:
        raise SystemExit("usage: python -m bench time NAME [--goal-s SECONDS] -- COMMAND...; "
                         f"given: {' '.join(args)!r}. Known names: {', '.join(catalog.TIMED)}")
    split = args.index("--")
    head, command = args[:split], args[split + 1:]
    name, goal_s = head[0], catalog.TIMED.get(head[0], ("", None))[1]
    if "--goal-s" in head:
        goal_s = float(head[head.index("--goal-s") + 1])
    if goal_s is None:
        raise SystemExit(f"no goal for {name!r}: pass --goal-s SECONDS (known names: "
                         f"{', '.join(catalog.TIMED)})")
    start = time.perf_counter()
    status = subprocess.call(command)
    wall = time.perf_counter() - start
    met = status == 0 and wall <= goal_s
    print(f"{name}: {wall:.1f} s wall, exit status {status}; goal wall <= {goal_s:g} s: "
          f"{records.verdict_of(met)}")
    records.write(name, figures={"wall_s": round(wall, 1), "exit_status": status},
                  goals={f"wall <= {goal_s:g} s, exit status 0": met},
                  command=["python", "-m", "bench", "time", *args])
    return status


def render_report(args: list[str]) -> int:
    text = report.render(records.read(), product=records.current_product())
    if "--check" in args:
        same = report.DOC.exists() and report.DOC.read_text() == text
        print(f"{report.DOC}: " + ("up to date" if same else "differs from the records' "
                                    "rendering: run `make bench-report`"))
        return 0 if same else 1
    report.DOC.write_text(text)
    print(f"wrote {report.DOC}")
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "list":
        return list_benches()
    if command == "time":
        return time_command(rest)
    if command == "report":
        return render_report(rest)
    if command not in catalog.BENCHES:
        print(f"no bench {command!r}: `python -m bench list` lists them", file=sys.stderr)
        return 2
    return run_bench(command, rest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
