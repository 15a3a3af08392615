"""Results store of a dataset run: one JSONL file, one JSON object per line.

Line 1 is the run line ``{"kind": "run", "format", "run", "key", "software"}``: ``key`` is
the command's parameters (the ones that decide the results), ``run`` their digest. Every
later line is one result record carrying the same ``run`` digest and the ``software``
versions. A store holds ONE run: opening it with another key is refused (with or without
``--resume``) while it holds results, so two runs never mix and a new run never discards
another run's work; a fresh run with the same key starts it afresh.

One writer at a time: ``Store`` takes an exclusive ``fcntl.flock`` on the store file before
reading it and holds it until ``close``; a second writer is refused at once. The kernel
drops the lock with the process (a kill -9 leaves no stale lock).

Records are validated on load, line by line: a line that is no JSON object, a record of
another run (its ``run`` digest is not the header's) or one the caller's ``validate``
refuses is skipped and reported by line number in ``Loaded.skipped``; it is never
returned, so a resumed run computes that result again.

Crash safety (kill -9 at any moment): a record is appended with ONE ``os.write`` of the
whole line (newline included) on an ``O_APPEND`` descriptor, then ``fsync``; a record is
committed once its newline is on disk. ``load`` drops a final line without its newline (or
a final line that is not a JSON object), says so in ``Loaded.dropped``, and never parses a
part of it; reopening for ``--resume`` truncates that fragment before appending. Source:
POSIX ``write(2)`` on ``O_APPEND`` files (each write goes to the end of file); the property
test in tests/test_cli_store.py cuts a store at every byte and loads a prefix of its records.
"""
from __future__ import annotations

import fcntl
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
    ``records``: the valid result records in file order; ``skipped``: (line number, reason) of
    every line that was not returned (bad JSON, another run's record, refused by ``validate``);
    ``dropped``: bytes of a cut final line that were ignored (0: the file ended on a complete
    record); ``size``: bytes kept."""

    path: str
    header: dict | None
    records: tuple = field(repr=False)
    dropped: int
    size: int
    skipped: tuple = ()


def _parse(raw: bytes):
    try:
        obj = json.loads(raw)
    except ValueError:  # bad UTF-8 too (UnicodeDecodeError is a ValueError)
        return None
    return obj if isinstance(obj, dict) else None


def _check_header(header, path) -> None:
    if header is None or header.get("kind") != "run" or header.get("format") != FORMAT:
        raise ValueError(f"--store: {path} is not a softcert results store (line 1 is no {FORMAT} run line); "
                         "pass another --store, or delete the file")
    key = header.get("key")
    if not isinstance(key, dict) or header.get("run") != run_digest(key):
        raise ValueError(f"--store: {path}: the run line's digest does not match its key (the line was edited); "
                         "pass another --store, or delete the file")


def _reason(obj, header, validate):
    """Why a parsed line is no usable record of this store's run (None: it is one)."""
    if obj is None:
        return "not a JSON object"
    if obj.get("run") != header["run"]:
        return f"a record of another run ({obj.get('run')!r}, this store's run is {header['run']!r})"
    return validate(obj) if validate is not None else None


def load(path, validate=None) -> Loaded:
    """Read a store; ``validate(record) -> reason or None`` refuses records field by field.

    Raises ValueError (naming --store) only when line 1 is no run line of this format.
    """
    path = Path(path)
    data = path.read_bytes() if path.exists() else b""
    end = data.rfind(b"\n") + 1
    lines = data[:end].split(b"\n")[:-1]
    objs = [_parse(raw) for raw in lines]
    if objs and objs[-1] is None and end == len(data):
        # a final line that is no object: a cut write whose bytes reached the disk before the
        # crash (a proper prefix of a JSON object is never an object)
        end -= len(lines[-1]) + 1
        objs.pop()
    if not objs:
        return Loaded(str(path), None, (), len(data) - end, end)
    header = objs[0]
    _check_header(header, path)
    records, skipped = [], []
    for i, obj in enumerate(objs[1:], start=2):
        why = _reason(obj, header, validate)
        if why is None:
            records.append(obj)
        else:
            skipped.append((i, why))
    return Loaded(str(path), header, tuple(records), len(data) - end, end, tuple(skipped))


def _warn(loaded: Loaded) -> None:
    for line, why in loaded.skipped:
        print(f"softcert: {loaded.path}: line {line} skipped ({why}); that result is computed again",
              file=sys.stderr)
    if loaded.dropped:
        print(f"softcert: {loaded.path}: dropped a cut final line ({loaded.dropped} bytes) left by an "
              "interrupted run; that result is computed again", file=sys.stderr)


class Store:
    """An open store of one run: ``Store(path, key, resume=..., validate=...)``, then ``append(record)``.

    Refuses (ValueError naming --store) a store locked by another writer, and a store holding
    results of another key. ``resume=False`` starts the file afresh (saying so on stderr when it
    held this run's results); ``resume=True`` keeps its valid records (``records``), reports the
    skipped ones on stderr and cuts a crash-truncated final line. Use as a context manager, or call ``close`` (which releases the lock).
    """

    def __init__(self, path, key: dict, *, resume: bool = False, validate=None):
        if not isinstance(key, dict):
            raise ValueError(f"key: expected a dict of the run's parameters, got {type(key).__name__}")
        self._fd = None
        self.path = Path(path)
        self.key = key
        self.run = run_digest(key)
        self.software = software()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            self._lock()
            self.records = self._open(resume, validate)
        except BaseException:
            self.close()
            raise

    def _lock(self) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ValueError(f"--store: {self.path} is in use by another running softcert command (it holds "
                             "the store's lock); wait for it to finish, or pass another --store") from None

    def _open(self, resume: bool, validate) -> tuple:
        """Check the store on disk against this run and set the file up for appending."""
        old = load(self.path, validate)
        if old.header is not None and old.header["run"] != self.run and old.records:
            raise ValueError(
                f"--store: {self.path} holds {len(old.records)} result(s) of a run with other parameters "
                f"({json.dumps(old.header.get('key'), sort_keys=True)}) than this run "
                f"({json.dumps(self.key, sort_keys=True)}); a store holds one run: pass another --store, "
                "or delete that file to discard its results")
        if resume and old.header is not None and old.header["run"] == self.run:
            _warn(old)
            os.ftruncate(self._fd, old.size)
            return old.records
        if old.records:  # the same run's results: rerunning without --resume discards them
            print(f"softcert: --store {self.path}: discarding the {len(old.records)} result(s) of an earlier run "
                  "of these parameters and starting afresh; pass --resume to keep them", file=sys.stderr)
        os.ftruncate(self._fd, 0)
        self._write({"kind": "run", "format": FORMAT, "run": self.run, "key": self.key,
                     "software": self.software})
        return ()

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
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
