"""Small seeded training problems shared by the tests (and by processes the tests start)."""

import numpy as np


def blobs():
    """A small seeded 3-class problem: (X_train, y_train, X_test, y_test)."""
    rng = np.random.default_rng(0)
    centers = rng.normal(scale=2.0, size=(3, 12))
    y = rng.integers(0, 3, size=600)
    X = (centers[y] + rng.normal(size=(600, 12))).astype("float32")
    return X[:480], y[:480], X[480:], y[480:]
