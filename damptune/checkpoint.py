"""Atomic checkpoint files on a local path or any fsspec URL, loaded with ``weights_only``.

The newest checkpoint is at ``path``; the ``keep - 1`` before it at ``path~1``, ``path~2``, …
(newest first). A checkpoint that is partial or corrupt is skipped for the previous one, with a
warning; when every generation is corrupt, they are kept aside (``<generation>.unreadable``) and
the run starts from the beginning, with a warning. A file that cannot be read at all (an I/O
error of its storage) may be sound: it is never set aside.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import uuid
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem

from damptune.errors import CheckpointError

__all__ = ["save_checkpoint", "load_checkpoint", "load_latest", "checkpoint_exists",
           "checkpoint_paths", "CorruptCheckpoint"]

log = logging.getLogger("damptune.checkpoint")


def checkpoint_paths(path: str, keep: int) -> list[str]:
    """``path`` and its older generations, newest first."""
    return [path] + [f"{path}~{i}" for i in range(1, keep)]


def save_checkpoint(path: str, ckpt: dict[str, Any], *, keep: int = 1) -> None:
    """Write ``ckpt`` to ``path`` atomically (temporary file, then rename), keeping the
    ``keep - 1`` previous checkpoints as ``path~1`` … (a reader, or a process killed mid-write,
    sees either the old or the new checkpoint)."""
    buf = io.BytesIO()
    torch.save(ckpt, buf)
    fs, fpath = fsspec.core.url_to_fs(path)
    parent = os.path.dirname(fpath)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = f"{fpath}.tmp-{uuid.uuid4().hex[:8]}"
    with fs.open(tmp, "wb") as f:
        f.write(buf.getvalue())
        if hasattr(f, "flush"):
            f.flush()
        if hasattr(f, "fileno"):
            with contextlib.suppress(OSError, io.UnsupportedOperation):
                os.fsync(f.fileno())
    generations = checkpoint_paths(fpath, keep)
    for older, newer in zip(reversed(generations[1:]), reversed(generations[:-1]), strict=True):
        if fs.exists(newer):
            _move(fs, newer, older)
    _move(fs, tmp, fpath)


def _move(fs: Any, src: str, dst: str) -> None:
    if isinstance(fs, LocalFileSystem):
        os.replace(src, dst)
    else:  # object stores: a single PUT is atomic; mv = copy + delete
        fs.mv(src, dst)


def checkpoint_exists(path: str) -> bool:
    fs, fpath = fsspec.core.url_to_fs(path)
    return bool(fs.exists(fpath))


def load_checkpoint(path: str) -> dict[str, Any]:
    """Load one checkpoint with ``weights_only=True`` (no arbitrary code runs). A file that
    cannot be read raises CheckpointError (caused by the OSError); one whose bytes are not a
    checkpoint, :class:`CorruptCheckpoint`."""
    fs, fpath = fsspec.core.url_to_fs(path)
    if not fs.exists(fpath):
        raise CheckpointError(f"checkpoint_path={path!r} does not exist")
    try:
        with fs.open(fpath, "rb") as f:
            data = f.read()
    except OSError as exc:  # the storage, not the file's bytes: it may be sound
        raise CheckpointError(f"checkpoint_path={path!r} could not be read: {exc}") from exc
    try:
        ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a corrupt file
        raise CorruptCheckpoint(f"checkpoint_path={path!r} could not be read: {exc}") from exc
    if not isinstance(ckpt, dict):
        kind = type(ckpt).__name__
        raise CorruptCheckpoint(f"checkpoint_path={path!r} holds a {kind}, not a dict")
    return ckpt


class CorruptCheckpoint(CheckpointError):
    """A checkpoint file whose bytes are not a checkpoint (torn, overwritten, truncated)."""


def load_latest(path: str, *, keep: int = 1) -> dict[str, Any] | None:
    """The newest readable checkpoint among ``path``'s generations (None if there is none).

    A partial or corrupt one is skipped for the previous, with a warning. When every existing
    generation is corrupt (:class:`CorruptCheckpoint`), they are kept aside as
    ``<generation>.unreadable`` and None is returned, with a warning: the run starts from the
    beginning. When one of them could not be read at all (an I/O error: it may be sound),
    CheckpointError, and nothing is set aside.
    """
    errors, corrupt = [], []
    for candidate in checkpoint_paths(path, max(keep, 1)):
        if not checkpoint_exists(candidate):
            continue
        try:
            ckpt = load_checkpoint(candidate)
        except CheckpointError as exc:
            log.warning("skipping an unreadable checkpoint: %s", exc)
            errors.append(str(exc))
            corrupt += [candidate] if isinstance(exc, CorruptCheckpoint) else []
            continue
        if errors:
            log.warning("resuming from the older checkpoint %s", candidate)
        return ckpt
    if len(corrupt) < len(errors):
        raise CheckpointError("no readable checkpoint: " + "; ".join(errors))
    if corrupt:
        _set_aside(corrupt)
        log.warning("no readable checkpoint of %s: its %d generation(s) are corrupt and kept as "
                    "%s; the run starts again from the beginning (its training is "
                    "deterministic: it ends as it would have)", path, len(corrupt),
                    ", ".join(f"{c}.unreadable" for c in corrupt))
    return None


def _set_aside(paths: list[str]) -> None:
    """Rename each corrupt generation to ``<name>.unreadable`` (replacing an older one), so
    the fresh run's checkpoints do not rotate over them."""
    for path in paths:
        fs, fpath = fsspec.core.url_to_fs(path)
        try:
            _move(fs, fpath, f"{fpath}.unreadable")
        except OSError as exc:  # left where it is: the fresh run's checkpoints replace it
            log.warning("could not keep %s aside: %s", path, exc)
