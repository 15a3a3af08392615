"""The results store (softcert.cli.store): one write per record, cut final lines dropped,
run keys checked on --resume, and any byte prefix of a store loads as a prefix of its records."""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from softcert.cli import store
from softcert.cli.store import Store, load

KEY = {"models": ["digits-vit1"], "eps": [0.01], "methods": ["ibp", "crown"], "n": 4}


def _record(i, **extra):
    return {"kind": "result", "model": "digits-vit1", "index": i, "eps": 0.01, "method": "crown",
            "verdict": "certified", "lower_margin": 0.1 * i + 1e-17, "seconds": 0.5, **extra}


def _filled(path, n=3, key=KEY):
    with Store(path, key) as s:
        for i in range(n):
            s.append(_record(i))
    return path


def test_append_is_one_write_on_an_append_descriptor_then_fsync(tmp_path, monkeypatch):
    calls, opened = [], []
    real_write, real_fsync, real_open = os.write, os.fsync, os.open
    monkeypatch.setattr(store.os, "open", lambda p, flags, *a: (opened.append(flags), real_open(p, flags, *a))[1])
    monkeypatch.setattr(store.os, "write", lambda fd, b: (calls.append(("write", fd, bytes(b))), real_write(fd, b))[1])
    monkeypatch.setattr(store.os, "fsync", lambda fd: (calls.append(("fsync", fd, None)), real_fsync(fd))[1])
    path = tmp_path / "s.jsonl"
    with Store(path, KEY) as s:
        assert len(opened) == 1 and opened[0] & os.O_APPEND and not opened[0] & os.O_TRUNC
        fd = calls[0][1]
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND
        calls.clear()
        s.append(_record(0))
        s.append(_record(1, note="a line\nbreak inside a string"))
    assert [c[0] for c in calls] == ["write", "fsync", "write", "fsync"]
    for kind, _, data in calls:
        if kind == "write":  # the whole record, newline included, and no other newline
            assert data.endswith(b"\n") and data.count(b"\n") == 1
            json.loads(data)
    lines = path.read_bytes().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["note"] == "a line\nbreak inside a string"


def test_records_carry_run_digest_and_software_versions(tmp_path):
    loaded = load(_filled(tmp_path / "s.jsonl"))
    assert loaded.header["key"] == KEY and loaded.dropped == 0
    assert [r["index"] for r in loaded.records] == [0, 1, 2]
    for r in loaded.records:
        assert r["run"] == loaded.header["run"] == store.run_digest(KEY)
        assert set(r["software"]) == {"softcert", "torch"} and r["software"]["torch"].startswith("2.")
        assert r["lower_margin"] == 0.1 * r["index"] + 1e-17  # floats round-trip exactly


@pytest.mark.parametrize("cut", ["half", "no-newline"])
def test_cut_final_line_is_dropped_reported_and_truncated_on_resume(tmp_path, capsys, cut):
    path = _filled(tmp_path / "s.jsonl")
    data = path.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    keep = last + (len(data) - last) // 2 if cut == "half" else len(data) - 1
    path.write_bytes(data[:keep])
    loaded = load(path)
    assert [r["index"] for r in loaded.records] == [0, 1] and loaded.dropped == keep - last
    with Store(path, KEY, resume=True) as s:
        assert [r["index"] for r in s.records] == [0, 1]
        s.append(_record(7))
    assert "dropped a cut final line" in capsys.readouterr().err
    again = load(path)  # the fragment is gone, not glued to the new record
    assert [r["index"] for r in again.records] == [0, 1, 7] and again.dropped == 0


def test_invalid_final_line_with_newline_is_dropped(tmp_path):
    path = _filled(tmp_path / "s.jsonl")
    with open(path, "ab") as f:
        f.write(b'{"kind": "result", "ind\n')
    loaded = load(path)
    assert len(loaded.records) == 3 and loaded.dropped == len(b'{"kind": "result", "ind\n')


def test_corrupt_line_before_the_end_is_an_error_naming_store(tmp_path):
    path = _filled(tmp_path / "s.jsonl")
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:10]
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError, match="--store: line 3 of"):
        load(path)
    other = tmp_path / "other.jsonl"
    other.write_text('{"kind": "something else"}\n')
    with pytest.raises(ValueError, match="--store: .* not a softcert results store"):
        load(other)


def test_resume_refuses_a_store_of_other_parameters(tmp_path):
    path = _filled(tmp_path / "s.jsonl")
    with pytest.raises(ValueError, match="--resume: the store .* other parameters.*--store"):
        Store(path, {**KEY, "eps": [0.02]}, resume=True)
    assert len(load(path).records) == 3  # refused before touching the file


def test_fresh_run_replaces_and_resume_keeps(tmp_path):
    path = _filled(tmp_path / "s.jsonl")
    with Store(path, KEY, resume=True) as s:
        assert len(s.records) == 3
        s.append(_record(3))
    assert len(load(path).records) == 4
    with Store(path, KEY) as s:
        assert s.records == ()
    assert load(path).records == () and load(path).header["run"] == store.run_digest(KEY)
    missing = tmp_path / "sub" / "new.jsonl"  # --resume without a store: a fresh one
    with Store(missing, KEY, resume=True) as s:
        assert s.records == ()
    assert load(missing).header is not None


def test_bad_arguments_are_value_errors(tmp_path):
    with pytest.raises(ValueError, match="key"):
        Store(tmp_path / "s.jsonl", ["not", "a", "dict"])
    with Store(tmp_path / "s.jsonl", KEY) as s:
        with pytest.raises(ValueError, match="record"):
            s.append("text")
    with pytest.raises(ValueError, match="record: the store .* is closed"):
        s.append(_record(0))


_values = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=12))
_records = st.lists(st.dictionaries(st.text(min_size=1, max_size=6), _values, max_size=4), max_size=5)


@given(_records)
def test_any_byte_prefix_loads_as_a_prefix_of_the_records(records):
    # durability is the other tests' business; fsync per example would only cost time here
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(store.os, "fsync", lambda fd: None):
        path = Path(tmp) / "s.jsonl"
        with Store(path, KEY) as s:
            for r in records:
                s.append(r)
        full = load(path).records
        assert len(full) == len(records)
        data = path.read_bytes()
        cut = Path(tmp) / "cut.jsonl"
        for k in range(len(data) + 1):
            cut.write_bytes(data[:k])
            got = load(cut)
            n = len(got.records)
            assert got.records == full[:n]
            complete = data[:k].count(b"\n")  # records are exactly the complete lines after the header
            assert n == max(0, complete - 1)
            assert got.size + got.dropped == k and (got.header is None) == (complete == 0)
