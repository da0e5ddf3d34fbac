"""Leases on trials, kept in the Optuna storage's database: one trainer per trial at a time.

A run that trains a trial holds its lease and renews it (heartbeat) every ``ttl / 6`` seconds.
A trial left RUNNING by a dead process has a lease that expires after ``ttl`` seconds; the
next run takes it over and resumes the trial from its checkpoint. Taking a lease is atomic in
SQL (an insert on the primary key, or an update conditioned on expiry), so two runs of the same
grid started at once never train the same trial twice. Optuna's own heartbeat works only with
``study.optimize``, not with ask/tell, hence this table.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sqlalchemy import Column, Float, MetaData, String, Table, create_engine, delete, or_, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from tasks.env import lease_ttl
from tasks.retries import retry

__all__ = ["Leases", "leases_for", "Heartbeat"]

_META = MetaData()
_TABLE = Table(
    "damptune_leases", _META,
    Column("key", String(512), primary_key=True),
    Column("owner", String(128), nullable=False),
    Column("expires", Float, nullable=False),  # time.time() seconds
)
# one SQLAlchemy engine per storage URL and process, shared by every session's threads
_CACHE: dict[str, Leases] = {}
_LOCK = threading.Lock()


def _retry(fn: Callable[[], bool], attempts: int = 5) -> bool:
    """SQLite says 'database is locked' when writers collide: wait and try again (the
    pipeline's one retry loop, :func:`tasks.retries.retry`); past the attempts, the error."""
    return retry(fn, transient=lambda exc: isinstance(exc, OperationalError),
                 attempts=attempts, delay=0.2)


def _create_table(engine: Engine) -> bool:
    _META.create_all(engine, checkfirst=True)
    return True


class Leases:
    """Leases of one storage URL (see module docstring)."""

    def __init__(self, url: str, *, ttl: float = 60.0) -> None:
        kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {}
        self.engine: Engine = create_engine(url, **kwargs)
        self.ttl = ttl
        _retry(lambda: _create_table(self.engine))

    def acquire(self, key: str, owner: str) -> bool:
        """Take the lease if it is free, expired, or already ours."""

        def attempt() -> bool:
            now = time.time()
            try:
                with self.engine.begin() as conn:
                    conn.execute(_TABLE.insert().values(key=key, owner=owner,
                                                        expires=now + self.ttl))
                return True
            except IntegrityError:
                pass
            with self.engine.begin() as conn:
                result = conn.execute(
                    update(_TABLE)
                    .where(_TABLE.c.key == key,
                           or_(_TABLE.c.expires < now, _TABLE.c.owner == owner))
                    .values(owner=owner, expires=now + self.ttl))
                return bool(result.rowcount == 1)

        return _retry(attempt)

    def renew(self, key: str, owner: str) -> bool:
        """Extend our lease; False if it is no longer ours."""

        def attempt() -> bool:
            with self.engine.begin() as conn:
                result = conn.execute(
                    update(_TABLE).where(_TABLE.c.key == key, _TABLE.c.owner == owner)
                    .values(expires=time.time() + self.ttl))
                return bool(result.rowcount == 1)

        return _retry(attempt)

    def release(self, key: str, owner: str) -> None:
        def attempt() -> bool:
            with self.engine.begin() as conn:
                conn.execute(delete(_TABLE).where(_TABLE.c.key == key, _TABLE.c.owner == owner))
            return True

        _retry(attempt)

    def held_by_other(self, key: str, owner: str) -> bool:
        """Someone else holds a live lease on ``key``."""
        with self.engine.connect() as conn:
            row = conn.execute(_TABLE.select().where(_TABLE.c.key == key)).first()
        return row is not None and row.owner != owner and row.expires >= time.time()


def leases_for(url: str, *, ttl: float | None = None) -> Leases:
    """The leases of a storage; ``ttl`` defaults to ``$DAMPTUNE_LEASE_TTL`` or 60 s
    (:func:`tasks.env.lease_ttl`)."""
    with _LOCK:
        if url not in _CACHE:
            ttl = ttl or lease_ttl()
            _CACHE[url] = Leases(url, ttl=ttl)
        return _CACHE[url]


class Heartbeat:
    """Renews a lease in a background thread while a trial trains; ``lost`` is set (and the
    trial stops, interrupted) if the lease was taken over."""

    def __init__(self, leases: Leases, key: str, owner: str) -> None:
        self.leases, self.key, self.owner = leases, key, owner
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"lease {key}")

    def _run(self) -> None:
        while not self._stop.wait(self.leases.ttl / 6):
            try:
                if not self.leases.renew(self.key, self.owner):
                    self.lost.set()
                    return
            except OperationalError:
                continue  # the storage is briefly unreachable: try at the next beat

    def stop_reason(self) -> str | None:
        """Why the trial must stop now (for ``train(should_stop=...)``), or None."""
        return "another run took the trial's lease" if self.lost.is_set() else None

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
