"""How far a grid has come, read from its own Optuna storage: finished trials per cell.

``make run`` (``infra.main``) shows it as a live line while the flow run works: cells done of
all, trials done, the held-out stage. One SQL query per look
(:func:`tasks.search.finished_per_cell`): the storage is the grid's record of its work, so the
line is true whichever process trains.

Example:
    >>> from tasks.grid import Cell
    >>> p = GridProgress.of([(Cell(2, "geodamp", "mlp"), 4)], {"n2/geodamp/mlp": 4})
    >>> (p.cells_done, p.cells, p.trials_done, p.trials)
    (1, 1, 4, 4)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tasks.grid import Cell
from tasks.search import finished_per_cell

__all__ = ["GridProgress", "finished_per_cell"]


@dataclass(frozen=True)
class GridProgress:
    """Counts of a grid's work: every stage's cells and trials, and the held-out stage's."""

    cells: int
    cells_done: int
    trials: int
    trials_done: int
    held_out_cells: int
    held_out_done: int

    @classmethod
    def of(cls, expected: Sequence[tuple[Cell, int]], finished: dict[str, int]) -> GridProgress:
        """From each cell's expected trials and the finished trials per cell key. A cell is
        done once its finished trials reach its expected count; a cell's trials beyond it
        (runner-ups of a validation cell) count as done trials, not as more to do."""
        done = [min(finished.get(c.key, 0), n) for c, n in expected]
        cell_done = [d >= n for d, (_, n) in zip(done, expected, strict=True)]
        held_out = [i for i, (c, _) in enumerate(expected) if c.stage != "search"]
        return cls(cells=len(expected), cells_done=sum(cell_done),
                   trials=sum(n for _, n in expected), trials_done=sum(done),
                   held_out_cells=len(held_out),
                   held_out_done=sum(cell_done[i] for i in held_out))

    def line(self) -> str:
        """One line for a terminal or a log: ``cells 12/80 · trials 301/784 · held-out 0/44``."""
        text = f"cells {self.cells_done}/{self.cells} · trials {self.trials_done}/{self.trials}"
        if self.held_out_cells:
            text += f" · held-out cells {self.held_out_done}/{self.held_out_cells}"
        return text
