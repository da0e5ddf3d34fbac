"""The maintained benchmarks: ``python -m bench list``, ``python -m bench NAME [args]``.

Each bench answers one question against a goal and appends its result as one JSON record to
``bench/results/<name>.jsonl`` (:mod:`bench.records`); ``make bench-report`` renders
``docs/benchmarks.md`` from the records (:mod:`bench.report`).
"""

from bench.catalog import BENCHES, TIMED
from bench.records import read, write

__all__ = ["BENCHES", "TIMED", "read", "write"]
