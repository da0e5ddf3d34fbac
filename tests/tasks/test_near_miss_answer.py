"""The answer says which of its configurations were near misses of their search: on the
search's one seed they ran out of its epochs just short of its target, and reached the
target on the held-out seeds (``search_shortfall``, read from Optuna by
:func:`tasks.validation.validation_rows`; its reading of real grids is in
``tests/flows/test_validation.py``)."""

from __future__ import annotations

from tasks.answer import answer_markdown
from tasks.stats import answer_rows

SEEDS = range(6)


def _row(network, algorithm, mean, shortfall, *, model="cnn", reached=True):
    values = {s: mean + 0.01 * s for s in SEEDS}
    return {"network": network, "model": model, "algorithm": algorithm, "study": algorithm,
            "values": values, "reached": {s: reached for s in SEEDS}, "params": {"x": 1},
            "validates": "", "n_seeds": len(values), "replaced": [], "retrained": 1,
            "unchanged_seeds": 0, "search_shortfall": shortfall}


def _text(rows):
    return answer_markdown(answer_rows(rows, baseline="geodamplr"))


def test_the_answer_names_its_near_misses_per_model():
    rows = [_row(n, "geodamplr", 1.2, 0.0) for n in (4, 8)]
    rows += [_row(4, "padadamp", 0.9, 0.011), _row(8, "padadamp", 0.9, 0.004),
             _row(4, "adadamp", 1.0, None), _row(8, "adadamp", 1.0, 0.0),  # None: not known
             _row(4, "geodamp-matched", 1.1, 0.02),  # a matched row is no search's answer
             _row(4, "geodamplr", 1.0, 0.0, model="mlp"), _row(4, "padadamp", 0.8, 0.0,
                                                                   model="mlp")]
    text = _text(rows)
    assert ("**cnn: 2 of 6 answers missed the search's target on its seed** (n4 padadamp, n8 "
            "padadamp): they ran out of the search's epochs 0.004–0.011 short of it") in text
    assert "a larger `epochs` for cnn" in text and "mlp:" not in text
    assert text.index("**cnn:") < text.index("### cnn on 4 ranks")


def test_no_sentence_without_a_near_miss_that_answers_reliably():
    rows = [_row(4, "geodamplr", 1.2, 0.0), _row(4, "padadamp", 0.9, 0.0),
            _row(4, "adadamp", 1.0, None)]
    assert "answers missed" not in _text(rows)
    # a near miss that missed the target on most held-out seeds answers nothing reliably
    rows.append(_row(4, "geodamp", 1.1, 0.01, reached=False))
    assert "answers missed" not in _text(rows)
    rows[1]["search_shortfall"] = 0.012
    assert ("**cnn: 1 of 4 answers missed the search's target on its seed** (n4 padadamp): they "
            "ran out of the search's epochs 0.012 short of it") in _text(rows)
