import numpy as np

from damptune.sampler import EpochSampler, split_shares


def test_sampler_sees_every_example_once_per_epoch_across_batch_sizes():
    s = EpochSampler(100, seed=3)
    drawn = np.concatenate([s.take(b) for b in (7, 30, 13, 50)])  # exactly 100
    assert sorted(drawn.tolist()) == list(range(100))
    assert s.state_dict() == {"epoch": 1, "position": 0}


def test_sampler_state_round_trip_is_exact():
    a = EpochSampler(50, seed=1)
    a.take(73)
    b = EpochSampler(50, seed=1)
    b.load_state_dict(a.state_dict())
    assert np.array_equal(a.take(40), b.take(40))


def test_sampler_permutations_depend_on_seed_and_epoch():
    a, b = EpochSampler(50, seed=1), EpochSampler(50, seed=2)
    assert not np.array_equal(a.take(50), b.take(50))
    assert not np.array_equal(a.permutation(0), a.permutation(1))


def test_split_shares_partitions_the_batch():
    idx = np.arange(10)
    shares = split_shares(idx, 4)
    assert [len(s) for s in shares] == [3, 3, 2, 2]
    assert np.array_equal(np.concatenate(shares), idx)
