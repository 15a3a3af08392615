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
from hypothesis import given, settings
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


def test_corrupt_line_before_the_end_is_skipped_and_reported(tmp_path, capsys):
    path = _filled(tmp_path / "s.jsonl")
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2][:10]
    path.write_bytes(b"\n".join(lines))
    loaded = load(path)
    assert [r["index"] for r in loaded.records] == [0, 2] and loaded.skipped == ((3, "not a JSON object"),)
    with Store(path, KEY, resume=True) as s:
        assert [r["index"] for r in s.records] == [0, 2]
    assert "line 3 skipped (not a JSON object)" in capsys.readouterr().err
    other = tmp_path / "other.jsonl"
    other.write_text('{"kind": "something else"}\n')
    with pytest.raises(ValueError, match="--store: .* not a softcert results store"):
        load(other)


def test_resume_refuses_a_store_of_other_parameters(tmp_path):
    path = _filled(tmp_path / "s.jsonl")
    for resume in (True, False):  # a fresh run must not discard another run's results either
        with pytest.raises(ValueError, match="--store: .* 3 result.* other parameters.*pass another --store"):
            Store(path, {**KEY, "eps": [0.02]}, resume=resume)
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


def test_fresh_run_over_this_runs_results_says_it_discards_them(tmp_path, capsys):
    path = _filled(tmp_path / "s.jsonl")
    capsys.readouterr()
    with Store(path, KEY):
        pass
    err = capsys.readouterr().err
    assert "discarding the 3 result(s)" in err and "--resume" in err and str(path) in err
    with Store(path, KEY):  # nothing stored: nothing said
        pass
    assert capsys.readouterr().err == ""


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


# ----------------------------------------------------------------------------- one run per store
def test_second_writer_is_refused_while_the_first_holds_the_store(tmp_path):
    # issue 27: run B opened the store of a running A, truncated it (A's image 0 was lost) and
    # later resumed on A's records; the lock refuses B at once, naming the store
    path = tmp_path / "s.jsonl"
    key_b = {**KEY, "eps": [0.02]}
    with Store(path, KEY) as a:
        a.append(_record(0))
        for key, resume in ((key_b, False), (key_b, True), (KEY, True)):
            with pytest.raises(ValueError, match=f"--store: {path} is in use by another .*pass another --store"):
                Store(path, key, resume=resume)
        a.append(_record(1))
    assert [r["index"] for r in load(path).records] == [0, 1]  # nothing of A was lost
    with Store(path, KEY, resume=True) as again:  # closed: the lock is free again
        assert len(again.records) == 2


def test_lock_dies_with_the_process(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "s.jsonl"
    code = ("import os, sys; from softcert.cli.store import Store; "
            f"s = Store({str(path)!r}, {KEY!r}); os._exit(0)")  # exits without close
    subprocess.run([sys.executable, "-c", code], check=True)
    with Store(path, KEY, resume=True) as s:
        assert s.records == ()


def test_records_of_another_run_are_skipped_never_reused(tmp_path, capsys):
    # the mixed file of issue 27: B's run line, then a record A appended after B truncated it
    path = tmp_path / "s.jsonl"
    key_b = {**KEY, "eps": [0.02]}
    with Store(path, key_b) as b:
        b.append(_record(5))
    with open(path, "ab") as f:
        f.write(store._line({**_record(0), "run": store.run_digest(KEY)}))
    loaded = load(path)
    assert [r["index"] for r in loaded.records] == [5]
    assert loaded.skipped[0][0] == 3 and "another run" in loaded.skipped[0][1]
    with Store(path, key_b, resume=True) as s:
        assert [r["index"] for r in s.records] == [5]
    assert "line 3 skipped (a record of another run" in capsys.readouterr().err


def test_edited_run_line_is_refused(tmp_path):
    path = _filled(tmp_path / "s.jsonl")
    lines = path.read_bytes().split(b"\n")
    head = json.loads(lines[0])
    head["key"]["eps"] = [0.5]  # the key edited, its digest not
    lines[0] = json.dumps(head).encode()
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(ValueError, match="--store: .* digest does not match its key"):
        load(path)


def _validate(d):
    ok = isinstance(d.get("index"), int) and not isinstance(d.get("index"), bool) and \
        isinstance(d.get("lower_margin"), float) and d.get("verdict") == "certified"
    return None if ok else "fields"


_cut = st.sampled_from(["truncate", "drop", "type", "other-run", "garbage", "bytes"])


@given(st.lists(st.tuples(st.integers(0, 4), _cut, st.integers(1, 200), st.binary(max_size=8)), max_size=4))
@settings(max_examples=80, deadline=None)
def test_corrupted_store_lines_never_crash_and_are_never_reused(edits):
    """Corrupt lines 2.. of a valid store (truncated JSON, a missing field, a wrong type, another
    run's digest, garbage bytes): load never raises, returns only the untouched records, and
    names every corrupted line."""
    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(store.os, "fsync", lambda fd: None):
        path = _filled(Path(tmp) / "s.jsonl", n=5)
        lines = path.read_bytes().split(b"\n")[:-1]
        bad = set()
        for i, how, k, junk in edits:
            n = i + 1  # a record line (0 is the run line)
            if n + 1 in bad:
                continue  # one corruption per line
            rec = json.loads(lines[n])
            if how == "truncate":
                lines[n] = lines[n][: k % len(lines[n])]
            elif how == "drop":
                rec.pop(sorted(["index", "lower_margin", "verdict", "run"])[k % 4])
                lines[n] = json.dumps(rec).encode()
            elif how == "type":
                rec[["index", "lower_margin", "verdict"][k % 3]] = [None, "1", True, {}][k % 4]
                lines[n] = json.dumps(rec).encode()
            elif how == "other-run":
                lines[n] = json.dumps({**rec, "run": "0" * 16}).encode()
            else:
                lines[n] = junk.replace(b"\n", b"") or b"x" if how == "bytes" else b"[1, 2]"
            bad.add(n + 1)
        path.write_bytes(b"\n".join(lines) + b"\n")
        loaded = load(path, _validate)
        good = [i for i in range(5) if i + 2 not in bad]
        last_bad = 6 in bad  # a bad final line may also be read as a cut write and dropped
        assert [r["index"] for r in loaded.records] == good
        assert {ln for ln, _ in loaded.skipped} | ({6} if last_bad and loaded.dropped else set()) == bad
        assert all(_validate(r) is None for r in loaded.records)
