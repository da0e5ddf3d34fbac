"""The DAMPTUNE_* variables: empty or unset take the default, a good value is read as given
(tests/flows/test_bad_input.py has the refusals, through the flow and the CLI)."""

import pytest

from tasks.env import check_cache, check_environment, lease_ttl, sqlite_timeout


@pytest.mark.parametrize("name", ["DAMPTUNE_LEASE_TTL", "DAMPTUNE_SQLITE_TIMEOUT"])
def test_seconds_variables_empty_or_unset_take_60_and_a_value_is_read(monkeypatch, name):
    read = {"DAMPTUNE_LEASE_TTL": lease_ttl, "DAMPTUNE_SQLITE_TIMEOUT": sqlite_timeout}[name]
    monkeypatch.delenv(name, raising=False)
    assert read() == 60.0
    monkeypatch.setenv(name, "")
    assert read() == 60.0
    monkeypatch.setenv(name, " 0.25 ")
    assert read() == 0.25
    check_environment()


def test_a_cache_directory_that_does_not_exist_yet_is_accepted_and_not_made(monkeypatch,
                                                                             tmp_path):
    cache = tmp_path / "not" / "yet"
    monkeypatch.setenv("DAMPTUNE_CACHE", str(cache))
    check_cache()
    assert not (tmp_path / "not").exists()
