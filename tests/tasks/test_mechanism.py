"""The mechanism in the report: a damped schedule reaches the target in about the same epochs but
fewer model updates, and on a data-parallel cluster fewer updates are less wall-clock time.
Each trial records it, the answer compares it seed by seed with the baseline, says it in a
sentence per pair and draws it against each profile's compute : communication ratio."""

import math
from types import SimpleNamespace

import matplotlib.image
import pytest

from damptune import TrainConfig
from damptune.netmodel import REPLAY_PROFILES, time_to_target
from tasks.answer import answer_markdown, mechanism_sentence, profile_costs
from tasks.figures import MECHANISM_FIGURE, draw_figures, speedup_vs_ratio
from tasks.mechanism import MECHANISM_ATTR, compute_comm_ratio, mechanism
from tasks.stats import ANSWER_COLUMNS, answer_rows, compare_pair
from tasks.trial import _complete_attrs

N_TRAIN, N_PARAMS = 1000, 50_000


def _config(**extra):
    return TrainConfig(module="models.mlp:MLP", n_train=N_TRAIN, max_workers=4,
                       per_worker_batch=64, compute_per_example=2e-5, compute_fixed=1e-4,
                       compute_norm=3e-5, overhead=5e-4, **extra)


def _history(*, reach_at=None, updates=40):
    """A growing batch (32 + 8 k examples, P = ⌈B / 64⌉ ranks, a damper pass of 256 examples
    every 5th update), an evaluation every 5 updates with accuracy k / 100; with ``reach_at``
    the evaluation at that update is the first at 0.9."""
    history, seen = [], 0
    for k in range(1, updates + 1):
        batch = 32 + 8 * k
        seen += batch
        history.append({"kind": "update", "update": k, "epoch": seen / N_TRAIN,
                        "examples_seen": seen, "batch_size": batch,
                        "n_workers": math.ceil(batch / 64),
                        "damper_examples": 256 if k % 5 == 0 else 0})
        if k % 5 == 0:
            history.append({"kind": "eval", "update": k, "epoch": seen / N_TRAIN,
                            "examples_seen": seen, "time_elapsed": 0.0, "time_sim": 0.0,
                            "test_accuracy": 0.9 if k == reach_at else k / 100})
    return history


def test_the_mechanism_counts_updates_epochs_and_the_time_on_every_profile_to_the_target():
    config, history = _config(damper="radadamp"), _history(reach_at=20)  # radadamp: norms
    m = mechanism(history, target=0.85, config=config, n_params=N_PARAMS)
    seen = sum(32 + 8 * k for k in range(1, 21))
    assert (m["updates"], m["examples"]) == (20, seen)
    assert m["epochs"] == pytest.approx(seen / N_TRAIN)
    assert m["mean_batch"] == pytest.approx(seen / 20)
    assert m["max_ranks"] == math.ceil((32 + 8 * 40) / 64)  # the run's, past the target
    assert m["profile"] == "ddp-100g" and set(m["profiles"]) == set(REPLAY_PROFILES)
    # the same seconds as the cost model's own replay of the history, on every profile
    for name, cost in profile_costs(config, N_PARAMS).items():
        replay = time_to_target(history, cost, target=0.85, norm=True)
        assert m["profiles"][name] == pytest.approx(replay.simulated_seconds, rel=1e-12)
    assert len(set(m["profiles"].values())) == len(REPLAY_PROFILES)  # the profiles differ
    cost = profile_costs(config, N_PARAMS)["centralized"]
    assert m["compute_comm"]["centralized"] == pytest.approx(
        (1e-4 + 64 * 2e-5) / (2 * 4 * (0.05e-6 + 4 * N_PARAMS / (54e9 / 8))))
    assert m["compute_comm"]["centralized"] == compute_comm_ratio(cost, n_ranks=4,
                                                                  per_rank_batch=64)


def test_a_run_that_missed_the_target_has_no_counts_to_it_and_its_whole_mean_batch():
    m = mechanism(_history(), target=0.85, config=_config(profile="custom:10:5"),
                  n_params=N_PARAMS)
    assert (m["updates"], m["epochs"], m["examples"]) == (None, None, None)
    assert m["mean_batch"] == pytest.approx(sum(32 + 8 * k for k in range(1, 41)) / 40)
    # every named profile and the run's own, none reached
    assert m["profiles"] == dict.fromkeys([*REPLAY_PROFILES, "custom:10:5"])
    assert mechanism([], target=0.5, config=_config(), n_params=1)["mean_batch"] is None


def test_a_complete_trial_records_its_mechanism():
    state = SimpleNamespace(history=_history(reach_at=10), config=_config(), n_params=N_PARAMS)
    attrs = _complete_attrs(state, None, target=0.85)
    assert attrs[MECHANISM_ATTR]["updates"] == 10
    assert attrs[MECHANISM_ATTR] == mechanism(state.history, target=0.85,
                                              config=state.config, n_params=N_PARAMS)


def _mech(updates, epochs, seconds):
    return {"updates": updates, "epochs": epochs, "examples": 1, "mean_batch": 1.0,
            "max_ranks": 4, "profile": "ddp-100g",
            "profiles": {"ddp-100g": seconds, "centralized": 3 * seconds},
            "compute_comm": {"ddp-100g": 4.0, "centralized": 0.5}}


SEEDS = range(6)
NOISE = (1.05, 0.95, 1.1, 0.9, 1.02, 0.98)  # per-seed wobble of the damped run's ratios


def _row(algorithm, mechanisms, *, network=8, reached=None, values=None):
    values = values or {s: (m or {}).get("profiles", {}).get("ddp-100g") or 9.0
                        for s, m in mechanisms.items()}
    return {"network": network, "model": "mlp", "algorithm": algorithm, "values": values,
            "reached": reached or {s: True for s in values}, "params": {}, "validates": "",
            "mechanism": mechanisms}


def _pair(network=8):
    base = {s: _mech(1000 + 100 * s, 10.0 + s, 8.0 + s) for s in SEEDS}
    damped = {s: _mech(base[s]["updates"] * 0.5 * w, base[s]["epochs"] * w,
                       base[s]["profiles"]["ddp-100g"] / (1.6 * w))
              for s, w in zip(SEEDS, NOISE, strict=True)}
    return [_row("geodamplr", base, network=network), _row("padadamp", damped, network=network)]


def test_half_the_updates_on_every_seed_is_an_updates_ratio_of_one_half():
    rows = {r["algorithm"]: r for r in compare_pair(_pair(), baseline="geodamplr")}
    damped = rows["padadamp"]
    mean_log = sum(math.log(0.5 * w) for w in NOISE) / len(NOISE)
    assert damped["updates_ratio"] == pytest.approx(math.exp(mean_log))  # this / baseline
    assert damped["updates_ratio_low"] < damped["updates_ratio"] < damped["updates_ratio_high"]
    assert damped["updates_ratio_low"] > 0.4 and damped["updates_ratio_high"] < 0.6
    assert damped["epochs_ratio_low"] < 1.0 < damped["epochs_ratio_high"]  # the same epochs
    low, mid, high = damped["profile_speedups"]["ddp-100g"]  # baseline's time / this one's
    assert low < 1.6 < high and mid == pytest.approx(1.6 * math.exp(mean_log - math.log(0.5)))
    assert damped["profile_speedups"]["centralized"] == pytest.approx((low, mid, high))
    assert rows["geodamplr"]["updates_ratio"] == pytest.approx(1.0)
    assert set(ANSWER_COLUMNS) >= {"updates_ratio", "updates_ratio_low", "updates_ratio_high",
                                   "epochs_ratio", "epochs_ratio_low", "epochs_ratio_high",
                                   "profile_speedups"}


def test_only_the_seeds_both_reached_are_paired_and_old_rows_get_none():
    base, damped = _pair()
    damped["reached"][0] = False  # seed 0 missed: its (absurd) counts are left out
    damped["mechanism"][0] = _mech(1, 1.0, 0.01)
    damped["mechanism"][1] = None  # a trial from before the mechanism was recorded
    rows = {r["algorithm"]: r for r in compare_pair([base, damped], baseline="geodamplr")}
    logs = [math.log(0.5 * w) for w in NOISE[2:]]
    assert rows["padadamp"]["updates_ratio"] == pytest.approx(math.exp(sum(logs) / len(logs)))
    old = [{k: v for k, v in r.items() if k != "mechanism"} for r in _pair()]
    for r in compare_pair(old, baseline="geodamplr"):
        assert r["updates_ratio"] is None and r["epochs_ratio_high"] is None
        assert r["profile_speedups"] is None
    alone = compare_pair([_pair()[1]], baseline="geodamplr")[0]  # no baseline in the pair
    assert alone["updates_ratio"] is None and alone["profile_speedups"] is None


def test_the_answer_says_how_the_best_damped_algorithm_won():
    rows = answer_rows(_pair(), baseline="geodamplr")
    u = e = next(r for r in rows if r["algorithm"] == "padadamp")
    s = u["profile_speedups"]["ddp-100g"]
    expected = (f"Mechanism: damping (padadamp) reached the target in "
                f"{1 / u['updates_ratio']:.2f}× [{1 / u['updates_ratio_high']:.2f}, "
                f"{1 / u['updates_ratio_low']:.2f}] fewer updates at "
                f"{e['epochs_ratio']:.2f}× [{e['epochs_ratio_low']:.2f}, "
                f"{e['epochs_ratio_high']:.2f}] the epochs; on profile ddp-100g that is "
                f"{s[1]:.2f}× [{s[0]:.2f}, {s[2]:.2f}] less wall-clock time.")
    assert expected in answer_markdown(rows)
    # half the updates, the same epochs, 1.6x the baseline's speed on every seed (± noise)
    assert expected == ("Mechanism: damping (padadamp) reached the target in 2.00× [1.86, "
                        "2.16] fewer updates at 1.00× [0.93, 1.08] the epochs; on profile "
                        "ddp-100g that is 1.60× [1.48, 1.72] less wall-clock time.")
    assert "on profile centralized that is" in mechanism_sentence(rows, profile="centralized")


def test_the_sentence_says_when_no_damped_algorithm_is_reliable_and_is_absent_for_old_grids():
    base, damped = _pair()
    damped["reached"] = {s: s < 2 for s in SEEDS}  # the target on 2 of 6 seeds
    rows = answer_rows([base, damped], baseline="geodamplr")
    assert "no damped algorithm reached the target on most held-out seeds" in (
        answer_markdown(rows))
    old = answer_rows([{k: v for k, v in r.items() if k != "mechanism"} for r in _pair()],
                      baseline="geodamplr")
    assert mechanism_sentence(old) == "" and "Mechanism" not in answer_markdown(old)


def _report():
    answer = answer_rows(_pair(4) + _pair(8), baseline="geodamplr")
    ranking = [{"network": r["network"], "model": "mlp", "algorithm": r["algorithm"],
                "best_value": 1.0, "reached": True, "target_accuracy": 0.9} for r in answer]
    return {"ranking": ranking, "answer": answer, "curves": [], "profiles": []}


def test_the_speedup_is_drawn_against_each_profiles_compute_to_communication_ratio(tmp_path):
    report = _report()
    ax = speedup_vs_ratio(report).axes[0]
    bars = {c.get_label(): c for c in ax.containers}  # one error-bar line per algorithm
    line = bars["padadamp"].lines[0]
    speedups = next(r for r in report["answer"]
                    if (r["network"], r["algorithm"]) == (8, "padadamp"))["profile_speedups"]
    # x: the profile's ratio (centralized 0.5, ddp-100g 4); y: the speedup's geometric mean
    assert list(line.get_xdata()) == [0.5, 4.0]
    assert list(line.get_ydata()) == pytest.approx([speedups["centralized"][1],
                                                    speedups["ddp-100g"][1]])
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "8 ranks" in ax.get_title()  # the largest network
    assert set(bars) == {"padadamp"}  # the baseline is the dashed line at 1
    paths = draw_figures(report, str(tmp_path))
    assert str(tmp_path / MECHANISM_FIGURE) in paths
    pixels = matplotlib.image.imread(str(tmp_path / MECHANISM_FIGURE))
    assert pixels.shape[0] >= 400 and pixels[..., :3].std() > 0.05
    old = {**report, "answer": [{**r, "profile_speedups": None} for r in report["answer"]]}
    (tmp_path / "old").mkdir()
    assert MECHANISM_FIGURE not in {p.rsplit("/", 1)[-1] for p in draw_figures(
        old, str(tmp_path / "old"))}
