"""What `damptune tune` says (and its exit status) when the grid did not complete: the
GridIncomplete message, for cells a stop came before."""

from tasks.report import GridIncomplete


def _row(failed=0, interrupted=0):
    return {"n_failed": failed, "n_interrupted": interrupted}


def test_the_cells_not_started_are_named_up_to_six_then_counted():
    keys = [f"n{2 ** i}/geodamp/mlp" for i in range(10)]
    stopped = GridIncomplete([_row()], [], [], keys)
    assert str(stopped) == (
        "the grid did not complete: 0 trial(s) FAIL, 0 interrupted, 10 cell(s) not started, "
        "a stop came first: n1/geodamp/mlp, n2/geodamp/mlp, n4/geodamp/mlp, n8/geodamp/mlp, "
        "n16/geodamp/mlp, n32/geodamp/mlp and 4 more (a rerun of the grid runs the cells not "
        "started)")
    assert stopped.exit_code == 75  # run it again


def test_cells_not_started_beside_a_failed_trial_exit_1():
    stopped = GridIncomplete([_row(failed=1), _row(interrupted=2)], [], [], ["n2/sgd/cnn"])
    message = str(stopped)
    assert message.startswith("the grid did not complete: 1 trial(s) FAIL, 2 interrupted, "
                              "1 cell(s) not started, a stop came first: n2/sgd/cnn ")
    assert "a rerun of the grid continues them" in message and stopped.exit_code == 1
