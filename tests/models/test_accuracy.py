from __future__ import annotations

from models.accuracy import main


def test_accuracy_script_trains_both_models_well_above_chance(capsys):
    argv = ["--dataset", "synthetic", "--n-samples", "1000", "--epochs", "5", "--batch-size", "20"]

    results = main(argv)

    out = capsys.readouterr().out
    assert set(results) == {"mlp", "cnn"}
    assert results["mlp"] > 0.8 and results["cnn"] > 0.8  # chance is 0.1; ≈0.95 seen
    assert out.count("test accuracy") == 2
