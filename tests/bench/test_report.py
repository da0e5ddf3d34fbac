"""docs/benchmarks.md is what the records render: never edited by hand, never stale."""

from __future__ import annotations

from bench import records, report


def test_report_doc_equals_the_records_rendering():
    """Fails when someone edits docs/benchmarks.md by hand or adds a record without
    `make bench-report`. The document says which product code it was rendered for, and is
    compared with the rendering for that product code: a change of product code alone does not
    make it stale (its records are then older than the product code, which the next
    `make bench-report` says)."""
    text = report.DOC.read_text()
    product = report.stated_product(text)
    assert product, f"{report.DOC} states no product code: run `make bench-report`"
    rendered = report.render(records.read(directory=records.ROOT / "bench" / "results"),
                             product=product)
    assert text == rendered, f"{report.DOC} differs from its records: run `make bench-report`"


def test_report_marks_a_record_on_older_product_code():
    record = {"bench": "code_shape", "command": ["python", "-m", "bench", "code_shape"],
              "commit": "0" * 40, "dirty": False, "product": "aaaa", "date": "2026-01-01",
              "machine": {"cpu": "x", "cores": 2, "pace_s": 1.0}, "figures": {"over": 1},
              "goal": "g", "verdict": "met"}
    older = report.render([record], product="bbbb")
    assert "on older product code `aaaa`" in older
    assert "on this product code" in report.render([record], product="aaaa")
    assert report.stated_product(older) == "bbbb"


def test_report_spreads_the_figures_of_records_on_one_product_code():
    def record(date: str, value: float) -> dict:
        return {"bench": "code_shape", "command": [], "commit": "c", "product": "p",
                "date": date, "machine": {}, "figures": {"x": value}, "goal": "g",
                "verdict": "met"}

    text = report.render([record("2026-01-03", 3.0), record("2026-01-01", 1.0),
                          record("2026-01-02", 10.0)], product="p")
    assert "| x | 3 | 1 | 3 | 10 | 3 |" in text  # latest, min, median, max, records
