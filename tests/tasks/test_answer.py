"""The report answers the user's question: per (network, model), which algorithm reaches the
target first and by how much it beats geodamplr, from real Optuna studies and the real
checkpoints of short local-mode training runs (tests/tasks/report_grids.py)."""

import dataclasses
import os

import matplotlib.image
import optuna
import pytest

from damptune import TrainConfig
from damptune.netmodel import REPLAY_PROFILES, time_to_target
from tasks.answer import n_params_of, rank_cells, replay_on_profiles
from tasks.figures import FIGURES, accuracy_curves, profiles_bars, time_vs_network
from tasks.grid import Cell, checkpoint_path
from tasks.report import build_report, grid_rows, write_report
from tests.tasks.report_grids import build_grid, checkpoint_of, settings_for

# the grid trains 10 short local-mode runs: its tests are marked slow. radadamp's replay needs
# its gradient norm charged (norm=True), cntsdamplr misses the target
NETWORKS, ALGORITHMS = (2, 4), ("geodamplr", "geodamp", "cntsdamplr", "radadamp")


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    settings = settings_for(str(tmp_path_factory.mktemp("grid")), grid_name="rep")
    return build_grid(settings, networks=NETWORKS, algorithms=ALGORITHMS)


def best_from_optuna(settings, cell):
    """The cell's best COMPLETE trial, read from Optuna directly: the fastest that reached the
    target (feasible), else the least value."""
    study = optuna.load_study(study_name=f"{settings.grid_name}/{cell.key}",
                              storage=settings.storage)
    return min((t for t in study.trials if t.state.name == "COMPLETE"),
               key=lambda t: (max(t.constraints.values()) > 0, t.value))


def missed(trial):
    return max(trial.constraints.values()) > 0


def pair(ranking, network, model="mlp"):
    return [r for r in ranking if r["network"] == network and r["model"] == model]


@pytest.mark.slow
def test_each_pair_ranks_its_algorithms_by_best_value_with_speedup_over_geodamplr(grid):
    ranking = build_report(grid_rows(grid.storage, grid_name="rep"),
                           run_dir=grid.run_dir)["ranking"]
    assert len(ranking) == len(NETWORKS) * len(ALGORITHMS)
    for network in NETWORKS:
        best = {a: best_from_optuna(grid, Cell(network, a, "mlp")) for a in ALGORITHMS}
        rows = pair(ranking, network)
        # those that reached the target first, by time; cntsdamplr missed it: last, no speedup
        assert [r["algorithm"] for r in rows] == sorted(
            ALGORITHMS, key=lambda a: (missed(best[a]), best[a].value))
        assert rows[-1]["algorithm"] == "cntsdamplr" and rows[-1]["reached"] is False
        assert rows[-1]["speedup_vs_geodamplr"] is None
        assert [r["rank"] for r in rows] == [1, 2, 3, 4]
        for r in rows:
            trial = best[r["algorithm"]]
            assert (r["best_trial"], r["best_params"]) == (trial.number, trial.params)
            assert r["best_value"] == trial.value
            if r["reached"]:
                assert r["speedup_vs_geodamplr"] == pytest.approx(
                    best["geodamplr"].value / trial.value)
        assert next(r for r in rows if r["algorithm"] == "geodamplr")[
            "speedup_vs_geodamplr"] == 1.0


@pytest.mark.slow
def test_updates_and_epochs_to_target_are_where_the_best_trial_stopped(grid):
    """A trial stops at its target: the report's updates and epochs to the target are its
    checkpoint's counters, and its value is the simulated time there."""
    ranking = build_report(grid_rows(grid.storage, grid_name="rep"),
                           run_dir=grid.run_dir)["ranking"]
    assert {r["reached"] for r in ranking} == {True, False}  # cntsdamplr misses the target
    for r in ranking:
        ckpt = checkpoint_of(grid, Cell(r["network"], r["algorithm"], "mlp"), r["best_trial"])
        counters, n_train = ckpt["counters"], ckpt["config"]["n_train"]
        assert r["reached"] is counters["target_reached"] and r["history"] == "ok"
        if r["reached"]:
            assert r["updates_to_target"] == counters["update"]
            assert r["epochs_to_target"] == pytest.approx(counters["examples_seen"] / n_train)
            assert r["best_value"] == pytest.approx(counters["time_sim"])
        else:
            assert r["updates_to_target"] is None and r["epochs_to_target"] is None
            assert r["best_value"] > counters["time_sim"]  # the shortfall's penalty


@pytest.mark.slow
def test_replay_on_the_grid_profile_gives_the_trial_value(grid):
    report = build_report(grid_rows(grid.storage, grid_name="rep"), run_dir=grid.run_dir)
    reached = {(r["network"], r["algorithm"]): r for r in report["ranking"] if r["reached"]}
    own = [p for p in report["profiles"] if p["profile"] == grid.profile]
    assert len(report["profiles"]) == len(REPLAY_PROFILES) * len(report["ranking"]) and own
    for p in own:
        row = reached.get((p["network"], p["algorithm"]))
        assert p["reached"] is (row is not None)
        if row is not None:
            assert p["seconds"] == pytest.approx(row["best_value"], rel=1e-9)
            assert p["updates"] == row["updates_to_target"]


@pytest.mark.slow
def test_profile_replay_orders_the_networks_and_keeps_the_run_overhead(grid):
    ckpt = checkpoint_of(grid, Cell(4, "geodamp", "mlp"), 1)
    seconds = {p["profile"]: p["seconds"] for p in replay_on_profiles(ckpt, target=0.45)}
    assert (seconds["decentralized-high"] <= seconds["decentralized-moderate"]
            < seconds["centralized"])
    # a run with its own overhead (seconds per update) is replayed with it on every profile
    config = dataclasses.replace(TrainConfig.from_dict(ckpt["config"]), overhead=0.5)
    slow = replay_on_profiles({**ckpt, "config": config.to_dict()}, target=0.45)
    assert all(p["seconds"] > seconds[p["profile"]] + 0.4 * p["updates"] for p in slow)
    own = time_to_target(ckpt["history"], config.cost_model(n_params_of(ckpt)), target=0.45)
    assert next(p for p in slow if p["profile"] == config.profile)["seconds"] == pytest.approx(
        own.simulated_seconds)


@pytest.mark.slow
def test_a_missing_checkpoint_says_history_unavailable_and_the_rest_is_reported(grid, tmp_path):
    path = checkpoint_path(grid, Cell(2, "geodamplr", "mlp"), 0)
    os.replace(path, tmp_path / "elsewhere.pt")
    try:
        report = build_report(grid_rows(grid.storage, grid_name="rep"), run_dir=grid.run_dir)
    finally:
        os.replace(tmp_path / "elsewhere.pt", path)
    row = next(r for r in report["ranking"] if (r["network"], r["algorithm"]) == (2, "geodamplr"))
    assert row["history"].startswith("history unavailable")
    assert "trial-0.pt" in row["history"] and "does not exist" in row["history"]
    assert row["reached"] is True and row["rank"] is not None and row["best_value"] > 0
    # (whether it reached the target is Optuna's: the constraint its trial was recorded with)
    others = [r for r in report["ranking"] if r is not row]
    assert all(r["history"] == "ok" for r in others)
    assert not [c for c in report["curves"] if (c["network"], c["algorithm"]) == (2, "geodamplr")]


@pytest.mark.slow
def test_report_files_and_figures_are_written_and_non_trivial(grid, tmp_path):
    report = build_report(grid_rows(grid.storage, grid_name="rep"), run_dir=grid.run_dir)
    written = write_report(report, str(tmp_path / "report"), title="Grid rep")
    names = {os.path.basename(p) for p in written}
    assert names == {"report.json", "report.md", "report.csv", "profiles.csv", "profiles.md",
                     "answer.json",  # the held-out seeds' statistics (empty without them)
                     "headroom.json",  # the cost model's ceiling (empty without a storage)
                     *FIGURES}
    for name in FIGURES:
        path = tmp_path / "report" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
        pixels = matplotlib.image.imread(str(path))
        assert pixels.shape[0] >= 400 and pixels.shape[1] >= 600
        assert pixels[..., :3].std() > 0.05  # drawn on, not a blank canvas
    md = (tmp_path / "report" / "report.md").read_text()
    assert "### mlp on 4 ranks" in md and "time_vs_network.png" in md


@pytest.mark.slow
def test_the_figures_plot_the_ranking_and_the_best_trials(grid):
    """The headline holds each algorithm's best values per network (a cross where the best
    trial missed the target); the curves end where the best trial reached the target; the
    bars are the profile replay."""
    report = build_report(grid_rows(grid.storage, grid_name="rep"), run_dir=grid.run_dir)
    ranking = report["ranking"]
    ax = time_vs_network(report).axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    missed = {c.get_label(): c.get_offsets().tolist() for c in ax.collections}
    for algorithm in ALGORITHMS:
        cells = sorted((r for r in ranking if r["algorithm"] == algorithm),
                       key=lambda r: r["network"])
        assert list(lines[algorithm].get_xdata()) == [r["network"] for r in cells]
        assert list(lines[algorithm].get_ydata()) == [r["best_value"] for r in cells]
        assert missed[f"{algorithm}: missed the target"] == [
            [r["network"], r["best_value"]] for r in cells if r["reached"] is False]
    ax = accuracy_curves(report, x_key="update", x_label="model updates").axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    for r in pair(ranking, max(NETWORKS)):  # the largest network
        # the target a search trial stopped at: the model's (0.45) plus search_margin
        target = r["target_accuracy"]
        assert target == grid.target_of(Cell(r["network"], r["algorithm"], "mlp")) > 0.45
        xs, ys = lines[r["algorithm"]].get_xdata(), lines[r["algorithm"]].get_ydata()
        assert all(y < target for y in ys[:-1])
        assert bool(ys[-1] >= target) is r["reached"]
        if r["reached"]:
            assert xs[-1] == r["updates_to_target"]
    heights = {bar.get_gid(): bar.get_height() for bar in profiles_bars(report).axes[0].patches}
    replayed = [p for p in report["profiles"] if p["network"] == max(NETWORKS)]
    assert len(heights) == sum(p["reached"] for p in replayed) > 0
    for p in replayed:
        if p["reached"]:
            assert heights[f"{p['algorithm']} on {p['profile']}"] == p["seconds"]


def test_rank_cells_without_a_baseline_or_a_value():
    """Plain data: no geodamplr in a pair, or a cell without a COMPLETE trial: no speedup,
    and the cell without a value ranks last, without a rank."""
    ranking = rank_cells([
        {"network": 8, "model": "cnn", "algorithm": "geodamp", "best_value": 3.0},
        {"network": 8, "model": "cnn", "algorithm": "adadamp", "best_value": None},
        {"network": 8, "model": "cnn", "algorithm": "padadamp", "best_value": 2.0},
        {"network": 2, "model": "cnn", "algorithm": "geodamplr", "best_value": None},
        {"network": 2, "model": "cnn", "algorithm": "geodamp", "best_value": 5.0},
    ])
    assert [(r["network"], r["algorithm"], r["rank"], r["speedup_vs_geodamplr"])
            for r in ranking] == [(2, "geodamp", 1, None), (2, "geodamplr", None, None),
                                  (8, "padadamp", 1, None), (8, "geodamp", 2, None),
                                  (8, "adadamp", None, None)]


@pytest.mark.slow
def test_the_report_states_the_cost_models_ceiling_from_the_grids_own_trials(grid, tmp_path):
    """Per pair and profile: s from the baseline's own cost model, φ from where the baseline's
    own damping first passes B0 (its first decay: where a damper could first grow), Amdahl's
    ceiling from both; in report.md (the grid's profile) and headroom.json (every one)."""
    report = build_report(grid_rows(grid.storage, grid_name="rep"), run_dir=grid.run_dir,
                          storage=grid.storage, grid_name="rep")
    assert sorted((r["network"], r["profile"]) for r in report["headroom"]) == sorted(
        (n, p) for n in NETWORKS for p in REPLAY_PROFILES)
    rows = {(r["network"], r["model"]): r for r in report["headroom"]
            if r["profile"] == grid.profile}
    assert set(rows) == {(n, "mlp") for n in NETWORKS}
    for network in NETWORKS:
        base = checkpoint_of(grid, Cell(network, "geodamplr", "mlp"),
                             best_from_optuna(grid, Cell(network, "geodamplr", "mlp")).number)
        config = TrainConfig.from_dict(base["config"])
        cost, n = config.cost_model(n_params_of(base)), config.n_train
        cap = network * config.per_worker_batch
        s = ((-(-n // 32)) * cost.update_seconds(batch_size=32, n_ranks=1)
             / ((-(-n // cap)) * cost.update_seconds(batch_size=cap, n_ranks=network)))
        row = rows[(network, "mlp")]
        assert row["profile"] == config.profile and row["s"] == pytest.approx(s) and s > 1
        decays = [r["examples_seen"] - r["batch_size"] for r in base["history"]
                  if r["kind"] == "update" and r["damping"] > 32]
        assert row["growth_examples"] == (decays[0] if decays else None)
        if row["phi"] is not None:
            assert 0 <= row["phi"] <= 1
            assert row["ceiling"] == pytest.approx(1 / ((1 - row["phi"]) + row["phi"] / s))
    write_report(report, str(tmp_path))
    text = (tmp_path / "report.md").read_text()
    assert "What the cost model lets damping win" in text and "ceiling" in text
    assert (tmp_path / "headroom.json").exists()
