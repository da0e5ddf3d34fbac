"""Atomic checkpoint files on a local path or any fsspec URL, loaded with ``weights_only``."""

from __future__ import annotations

import contextlib
import io
import os
import uuid
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem

from damptune.errors import CheckpointError

__all__ = ["save_checkpoint", "load_checkpoint", "checkpoint_exists"]


def save_checkpoint(path: str, ckpt: dict[str, Any]) -> None:
    """Write ``ckpt`` to ``path`` atomically: a temporary file, then a rename over the old one.

    A reader (or a process killed mid-write) sees either the old or the new checkpoint.
    """
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
    if isinstance(fs, LocalFileSystem):
        os.replace(tmp, fpath)
    else:  # object stores: a single PUT is atomic; mv = copy + delete of the temp object
        fs.mv(tmp, fpath)


def checkpoint_exists(path: str) -> bool:
    fs, fpath = fsspec.core.url_to_fs(path)
    return bool(fs.exists(fpath))


def load_checkpoint(path: str) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True`` (no arbitrary code runs)."""
    fs, fpath = fsspec.core.url_to_fs(path)
    if not fs.exists(fpath):
        raise CheckpointError(f"checkpoint_path={path!r} does not exist")
    try:
        with fs.open(fpath, "rb") as f:
            data = f.read()
        ckpt = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for a corrupt file
        raise CheckpointError(f"checkpoint_path={path!r} could not be read: {exc}") from exc
    if not isinstance(ckpt, dict):
        kind = type(ckpt).__name__
        raise CheckpointError(f"checkpoint_path={path!r} holds a {kind}, not a dict")
    return ckpt
