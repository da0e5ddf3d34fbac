"""The grid's choices: the values a few of its settings accept (one list each, for the grid's
validators and the flow's parameter schema). Imports nothing, so the command-line parser can
read them."""

from __future__ import annotations

__all__ = ["PRUNERS", "GRID_MODES", "GRID_DEVICES", "SAMPLERS", "OBJECTIVES"]

# "bound": a trial stops once its simulated time exceeds the cell's best value (it can never
# win); "hyperband", "sha": that, and Optuna's multi-fidelity pruner on the objective so far;
# "none": every trial runs to its target or its epochs
PRUNERS = ("bound", "hyperband", "sha", "none")
# "local": every trial trains in the flow's process, without ranks (the same math and simulated
# time; for a laptop, or a benchmark of the answer such as bench/answer_stability.py)
GRID_MODES = ("centralized", "decentralized", "local")
# where the ranks train: 'cpu'; 'cuda' (a GPU per rank, checked against the cluster's workers
# when the session opens); 'auto' (CUDA when the workers have it); damptune.devices
GRID_DEVICES = ("cpu", "cuda", "auto")
# "auto": a Gaussian process for up to two hyperparameters (every damper), TPE above (tasks.search)
SAMPLERS = ("auto", "tpe", "gp")
# a trial's value (tasks.objective): "target", the simulated time to the first evaluation at the
# target accuracy; "budget", the AdaDamp paper's: the simulated time of the whole epoch budget,
# subject to the final (moving-average) test accuracy reaching the target
OBJECTIVES = ("target", "budget")
