"""Results store of a dataset run: one JSONL file, one JSON object per line.

Line 1 is the run line ``{"kind": "run", "format", "run", "key", "software"}``: ``key`` is
the command's parameters (the ones that decide the results), ``run`` their digest. Every
later line is one result record carrying the same ``run`` digest and the ``software``
versions. ``--resume`` reopens a store only when its key equals the new run's.

Crash safety (kill -9 at any moment): a record is appended with ONE ``os.write`` of the
whole line (newline included) on an ``O_APPEND`` descriptor, then ``fsync``; a record is
committed once its newline is on disk. ``load`` drops a final line without its newline (or
one that is not a JSON object), says so in ``Loaded.dropped``, and never parses a part of it;
reopening for ``--resume`` truncates that fragment before appending. Any other unreadable
line is corruption, not a crash, and raises. Source: POSIX ``write(2)`` on ``O_APPEND``
files (each write goes to the end of file); the property test in tests/test_cli_store.py
cuts a store at every byte and loads a prefix of its records.
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FORMAT", "Loaded", "Store", "load", "run_digest", "software"]

FORMAT = "softcert-store/1"


def software() -> dict:
    """Versions that produced a record: softcert (its distribution metadata) and torch."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    try:
        ours = version("softcert")
    except PackageNotFoundError:  # a source tree that was never installed
        ours = "unknown"
    return {"softcert": ours, "torch": torch.__version__}


def _line(obj: dict) -> bytes:
    # sorted keys, no spaces: the same record always serialises to the same bytes; json
    # escapes newlines inside strings, so the only newline is the terminator
    return (json.dumps(obj, sort_keys=True, separators=(",", ":")) + "\n").encode()


def run_digest(key: dict) -> str:
    """sha256 (first 16 hex digits) of the key's canonical JSON."""
    return hashlib.sha256(_line(key)).hexdigest()[:16]


@dataclass(frozen=True)
class Loaded:
    """A store as read from disk. ``header``: the run line (None: empty or cut inside it);
    ``records``: the result records in file order; ``dropped``: bytes of a cut final line
    that were ignored (0: the file ended on a complete record); ``size``: bytes kept."""

    path: str
    header: dict | None
    records: tuple = field(repr=False)
    dropped: int
    size: int


def load(path) -> Loaded:
    """Read a store. Raises ValueError (naming --store) on a corrupt line other than the last."""
    path = Path(path)
    data = path.read_bytes() if path.exists() else b""
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1]
    objs = []
    for i, raw in enumerate(lines):
        try:
            obj = json.loads(raw)
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            if i == len(lines) - 1 and end == len(data):
                # a final line that is no object: a cut write whose bytes reached the disk
                # before the crash (a proper prefix of a JSON object is never an object)
                end -= len(raw) + 1
                break
            raise ValueError(f"--store: line {i + 1} of {path} is not a JSON record; the store is corrupt "
                             "(only its final line may be cut by a crash)")
        objs.append(obj)
    header = None
    if objs:
        header = objs[0]
        if header.get("kind") != "run" or header.get("format") != FORMAT:
            raise ValueError(f"--store: {path} is not a softcert results store (line 1 is no {FORMAT} run line)")
    return Loaded(str(path), header, tuple(objs[1:]), len(data) - end, end)


class Store:
    """An open store of one run: ``Store(path, key, resume=...)``, then ``append(record)``.

    ``resume=False`` starts the file afresh (a new run replaces an old store at that path);
    ``resume=True`` keeps its records when its key equals ``key`` (ValueError naming
    --resume/--store otherwise) and cuts a crash-truncated final line. ``records``: what was
    already there. Use as a context manager, or call ``close``.
    """

    def __init__(self, path, key: dict, *, resume: bool = False):
        if not isinstance(key, dict):
            raise ValueError(f"key: expected a dict of the run's parameters, got {type(key).__name__}")
        self._fd = None
        self.path = Path(path)
        self.key = key
        self.run = run_digest(key)
        self.software = software()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        old = load(self.path) if resume else None
        if old is not None and old.header is not None and old.header.get("run") != self.run:
            raise ValueError(
                f"--resume: the store {self.path} was made with other parameters "
                f"({json.dumps(old.header.get('key'), sort_keys=True)}) than this run "
                f"({json.dumps(key, sort_keys=True)}); choose another --store or drop --resume")
        if old is not None and old.dropped:
            print(f"softcert: {self.path}: dropped a cut final line ({old.dropped} bytes) left by an "
                  "interrupted run; that result is computed again", file=sys.stderr)
        self.records = old.records if old is not None and old.header is not None else ()
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        self._fd = os.open(self.path, flags, 0o644)
        try:
            if self.records:
                os.ftruncate(self._fd, old.size)
            else:
                os.ftruncate(self._fd, 0)
                self._write({"kind": "run", "format": FORMAT, "run": self.run, "key": key,
                             "software": self.software})
        except BaseException:
            os.close(self._fd)
            raise

    def _write(self, obj: dict) -> None:
        line = _line(obj)
        start = os.fstat(self._fd).st_size
        written = os.write(self._fd, line)
        if written != len(line):  # disk full: take the fragment back so the file stays whole
            os.ftruncate(self._fd, start)
            raise OSError(f"{self.path}: short write ({written} of {len(line)} bytes)")
        os.fsync(self._fd)

    def append(self, record: dict) -> None:
        """Append one result record (a JSON object) with the run digest and software versions."""
        if not isinstance(record, dict):
            raise ValueError(f"record: expected a dict, got {type(record).__name__}")
        if self._fd is None:
            raise ValueError(f"record: the store {self.path} is closed")
        self._write({**record, "run": self.run, "software": self.software})

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
