"""Where a grid's results go, checked before any work: the Optuna storage and MLflow URIs."""

from __future__ import annotations

from urllib.parse import urlparse

from damptune import ConfigError
from tasks.grid import GridSettings

__all__ = ["check_locations", "TRACKING_SCHEMES"]

# what MLflow's tracking store accepts: a path, file:, a database (SQLAlchemy), a server
TRACKING_SCHEMES = ("", "file", "sqlite", "postgresql", "mysql", "mssql", "http", "https",
                    "databricks")


def check_locations(settings: GridSettings) -> None:
    """A ``storage`` SQLAlchemy cannot parse, or a ``tracking_uri`` of a scheme MLflow has no
    store for, is refused naming the parameter (nothing is written yet)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        make_url(settings.storage)
    except ArgumentError:
        raise ConfigError("storage", settings.storage, "a SQLAlchemy database URL such as "
                          "sqlite:///runs/grid/optuna.db or postgresql://HOST/DB") from None
    scheme = urlparse(settings.tracking_uri).scheme.split("+")[0]
    if scheme not in TRACKING_SCHEMES:
        raise ConfigError("tracking_uri", settings.tracking_uri,
                          f"an MLflow tracking URI: a path, or a URI of scheme "
                          f"{', '.join(s for s in TRACKING_SCHEMES if s)}")
