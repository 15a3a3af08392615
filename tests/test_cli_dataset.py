"""Dataset runs (softcert.cli.dataset): a LocalCluster of 2 workers on the loopback interface
and an existing cluster give the in-process table; kill -9 mid-run, then --resume, gives the
uninterrupted table; no Dask process outlives a run."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import softcert.cli
from softcert.cli import dataset
from softcert.cli.store import load

ROOT = Path(__file__).resolve().parents[1]
N = 5
ARGS = ["certify", "--model", "digits-vit1", "--eps", "0.01", "--methods", "ibp", "crown", "--n", str(N)]
JOB = dataset.Job(("digits-vit1",), (0.01,), ("ibp", "crown"), N)
TIMING = ("seconds", "peak", "_mb", "worker")  # keys that describe the machine, not the model


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted in-process run (no Dask)."""
    out = tmp_path_factory.mktemp("reference")
    assert softcert.cli.main(ARGS + ["--out", str(out)]) == 0
    return out


def _close(a, b, where):
    """Same structure; numbers equal up to 1e-12 relative (the same code in another process)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            if not any(t in k for t in TIMING):
                _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and not isinstance(b, bool):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12), (where, a, b)
    else:
        assert a == b, (where, a, b)


def _tables(out):
    """The Markdown table rows of results.md, without the timing columns."""
    rows, keep = [], None
    for line in (out / "results.md").read_text().splitlines():
        if not line.startswith("|"):
            keep = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if keep is None:
            keep = [i for i, c in enumerate(cells) if not any(t in c.lower() for t in ("s / sample", "peak", "mb"))]
        rows.append([cells[i] for i in keep])
    return rows


def _same_table(out, ref):
    _close(json.loads((out / "results.json").read_text())["rows"],
           json.loads((ref / "results.json").read_text())["rows"], "rows")
    got, want = _tables(out), _tables(ref)
    assert len(got) == len(want)
    for g, w in zip(got, want):  # printed numbers: equal to the printed precision
        for x, y in zip(g, w):
            try:
                assert math.isclose(float(x), float(y), rel_tol=1e-3), (g, w)
            except ValueError:
                assert x == y, (g, w)


def _lingering(pids):
    alive = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def _dask_children():
    """Our child processes other than multiprocessing's resource tracker (it lives as long as we do)."""
    return [p.pid for p in psutil.Process().children(recursive=True)
            if "resource_tracker" not in " ".join(p.cmdline())]


def _wait_gone(pids, what):
    for _ in range(600):  # a bounded wait for the processes to exit, not a timing
        if not _lingering(pids):
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} still alive: {[p.cmdline()[:4] for p in _lingering(pids)]}")


def test_local_cluster_of_two_loopback_workers_gives_the_in_process_table(reference, tmp_path, capsys):
    before = set(_dask_children())
    out = tmp_path / "cluster"
    try:
        assert softcert.cli.main(ARGS + ["--out", str(out), "--workers", "2"]) == 0
    finally:
        _wait_gone(set(_dask_children()) - before, "Dask processes after the run")
    said = capsys.readouterr().out
    assert f"{N} images computed, 0 taken" in said and "local cluster (2 workers) at tcp://127.0.0.1:" in said
    _same_table(out, reference)
    stored = load(out / "store.jsonl").records
    assert len(stored) == N * 2
    ran_on = {r["worker"] for r in stored}  # host:pid of the process that ran each image
    assert 1 <= len(ran_on) <= 2 and not any(w.endswith(f":{os.getpid()}") for w in ran_on)


def test_local_cluster_workers_keep_the_default_malloc_trim():
    """The workers of a cluster the run starts do not inherit dask's MALLOC_TRIM_THRESHOLD_
    (it made each bound about 4x slower there: docs/certify/findings.md)."""
    client, cluster = dataset._dask(1, None)
    try:
        assert client.submit(os.environ.get, "MALLOC_TRIM_THRESHOLD_", pure=False).result() is None
    finally:
        client.close()
        cluster.close()


def test_existing_cluster_by_address(reference, tmp_path):
    """--scheduler: a cluster the run did not start (threads in this process, on loopback TCP)."""
    from dask.distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}) as cluster:
        res = dataset.run(JOB, tmp_path / "s.jsonl", scheduler=cluster.scheduler_address, progress=False)
        assert len(cluster.scheduler.workers) == 1  # the run left the cluster running
    assert res.ran == N and res.mode == f"scheduler {cluster.scheduler_address}"
    ref = dataset.run(JOB, reference / "store.jsonl", resume=True, progress=False)
    assert ref.ran == 0 and ref.skipped == N
    for a, b in zip(res.evaluations["digits-vit1"].records, ref.evaluations["digits-vit1"].records):
        _close(a.__dict__, b.__dict__, f"image {a.index} {a.method}")


def test_kill_9_mid_run_then_resume_gives_the_uninterrupted_table(reference, tmp_path, capsys):
    out, st = tmp_path / "killed", tmp_path / "killed" / "run.jsonl"
    total = N * 2
    log = open(tmp_path / "stderr.txt", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "softcert", *ARGS, "--out", str(out), "--workers", "1",
                             "--store", str(st)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log,
                            start_new_session=True)
    group = set()
    try:
        for _ in range(6000):  # until the first record is on disk (bounded wait, nothing timed)
            group |= {p.pid for p in psutil.process_iter() if _pgid(p.pid) == proc.pid}
            if st.exists() and len(load(st).records) >= 1:
                break
            assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-2000:]
            time.sleep(0.05)
        group |= {p.pid for p in psutil.process_iter() if _pgid(p.pid) == proc.pid}
        assert proc.poll() is None, "the run finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)  # client, nanny and worker alike
        proc.wait()
        assert len(group) >= 3  # the command and at least a nanny and a worker were running
        _wait_gone(group, "processes of the killed run")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
    kept = load(st)
    assert 1 <= len(kept.records) < total and not (out / "results.json").exists()  # killed mid-run
    assert softcert.cli.main(ARGS + ["--out", str(out), "--store", str(st), "--resume"]) == 0
    said = capsys.readouterr().out
    skipped = len(kept.records) // 2  # images with both records stored are not computed again
    assert f"{N - skipped} images computed, {skipped} taken from" in said
    _same_table(out, reference)
    final = load(st).records
    assert final[: len(kept.records)] == kept.records and len(final) == total
    assert len({(r["index"], r["eps"], r["method"]) for r in final}) == total  # nothing twice


def _pgid(pid):
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None


def test_resume_computes_only_the_missing_methods_of_an_image(reference, tmp_path, capsys):
    st = tmp_path / "s.jsonl"
    lines = (reference / "store.jsonl").read_bytes().splitlines(keepends=True)
    st.write_bytes(b"".join(lines[:-1]))  # the last image lost its crown record
    res = dataset.run(JOB, st, resume=True, progress=False)
    assert res.ran == 1 and res.skipped == N - 1
    added = load(st).records[-1]
    assert added["method"] == "crown" and added["index"] == N - 1
    _close(added, json.loads(lines[-1]), "re-computed record")


def test_record_round_trip_and_verdicts(reference):
    ev = dataset.run(JOB, reference / "store.jsonl", resume=True, progress=False).evaluations["digits-vit1"]
    assert [(r.method, r.index) for r in ev.records] == [(m, i) for m in ("ibp", "crown") for i in range(N)]
    for r in ev.records:
        d = dataset.record_to_json("digits-vit1", r)
        assert dataset.record_from_json(json.loads(json.dumps(d))) == r
        assert d["verdict"] == ("certified" if r.certified else "not certified")
        assert d["pgd"] in ("counterexample", "none found", "misclassified")
        assert d["model"] == "digits-vit1" and d["index"] == r.index


def test_bad_options_are_errors_naming_them(tmp_path, capsys, monkeypatch):
    assert softcert.cli.main(ARGS + ["--out", str(tmp_path), "--workers", "0"]) == 2
    assert "--workers" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # argparse: one of --workers/--scheduler
        softcert.cli.main(ARGS + ["--out", str(tmp_path), "--workers", "1", "--scheduler", "tcp://127.0.0.1:1"])
    assert "--scheduler" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--workers/--scheduler"):
        dataset.run(JOB, tmp_path / "s.jsonl", workers=1, scheduler="tcp://127.0.0.1:1")
    monkeypatch.setitem(sys.modules, "dask.distributed", None)  # as if the dist extra were missing
    with pytest.raises(ImportError, match=r"softcert\[dist\]"):
        dataset.run(JOB, tmp_path / "s.jsonl", workers=1)
    assert not (tmp_path / "s.jsonl").exists()  # refused before any work
    assert softcert.cli.main(ARGS + ["--out", str(tmp_path), "--methods", "magic"]) == 2
    assert "--methods" in capsys.readouterr().err


def test_cascade_run_counts_the_union_and_resumes_its_whole_chain(reference, tmp_path):
    out = tmp_path / "cascade"  # eps 0.01 as the reference, and 0.1, where PGD breaks images
    args = ["certify", "--model", "digits-vit1", "--eps", "0.01", "0.1", "--methods", "ibp", "crown", "--n", str(N)]
    assert softcert.cli.main(args + ["--out", str(out), "--cascade"]) == 0
    rows = json.loads((out / "results.json").read_text())["rows"][:2]
    ref = json.loads((reference / "results.json").read_text())["rows"]
    recs = [r for r in load(reference / "store.jsonl").records]
    union = {r["index"] for r in recs if r["certified"]}
    assert [r["certified_acc"] for r in rows] == [ref[0]["certified_acc"], len(union) / N]
    assert all(r["cascade"] for r in rows) and "(cascade: bounded" in (out / "results.md").read_text()
    stored = load(out / "store.jsonl")
    assert stored.header["key"]["cascade"] is True and "cascade" not in load(reference / "store.jsonl").header["key"]
    assert all(dataset.validate_result(r) is None for r in stored.records)
    broken = [r for r in stored.records if r["pgd"] == "counterexample"]
    assert broken and all(r["skipped"] == "counterexample" and r["lower_margin"] is None for r in broken)
    lines = (out / "store.jsonl").read_bytes().splitlines(keepends=True)
    (out / "store.jsonl").write_bytes(b"".join(lines[:-1]))  # the last image lost its crown record
    job = dataset.Job(("digits-vit1",), (0.01, 0.1), ("ibp", "crown"), N, cascade=True)
    res = dataset.run(job, out / "store.jsonl", resume=True, progress=False)
    assert res.ran == 1 and [(r["eps"], r["method"]) for r in load(out / "store.jsonl").records[-2:]] == [
        (0.1, "ibp"), (0.1, "crown")]
    ev = res.evaluations["digits-vit1"]
    assert ev.certified_accuracy(0.01, "crown") == (len(union), N)


# ----------------------------------------------------------------------------- store records validated
ONE = dataset.Job(("digits-vit1",), (0.01,), ("ibp",), 1)


def test_resume_recomputes_a_record_missing_its_result_fields(tmp_path, capsys):
    # issue 27: such a record crashed --resume with TypeError: Record.__init__() missing 7 ...
    from softcert.cli.store import Store

    path = tmp_path / "s.jsonl"
    with Store(path, ONE.key()) as s:
        s.append({"kind": "result", "model": "digits-vit1", "index": 0, "eps": 0.01, "method": "ibp"})
    res = dataset.run(ONE, path, resume=True, progress=False)
    assert res.ran == 1 and res.skipped == 0
    assert "line 2 skipped (field 'label' is missing)" in capsys.readouterr().err
    (rec,) = res.evaluations["digits-vit1"].records
    assert dataset.validate_result(dataset.record_to_json("digits-vit1", rec)) is None


def test_a_run_with_other_settings_is_refused_by_the_store_of_another(tmp_path):
    path = tmp_path / "s.jsonl"
    dataset.run(ONE, path, progress=False)
    kept = path.read_bytes()
    other = dataset.Job(("digits-vit1",), (0.02,), ("ibp",), 1)
    for resume in (False, True):
        with pytest.raises(ValueError, match="--store: .* other parameters"):
            dataset.run(other, path, resume=resume, progress=False)
    assert path.read_bytes() == kept  # A's finished record is still there, and alone


def _valid_record():
    return {"kind": "result", "model": "digits-vit1", "index": 3, "eps": 0.01, "method": "crown", "label": 4,
            "correct": True, "robust": True, "certified": True, "lower_margin": 0.5, "pgd_margin": 2.0,
            "seconds": 0.1, "note": "", "class_margins": [0.5, 0.0, 1.0], "predicted": 4, "peak_mb": None,
            "skipped": ""}


_junk = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(), st.text(max_size=3),
                  st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))


@given(st.lists(st.tuples(st.sampled_from(sorted(_valid_record())), st.booleans(), _junk), max_size=4))
@settings(max_examples=150, deadline=None)
def test_validate_result_never_raises_and_what_it_accepts_loads(edits):
    """Fields dropped or replaced by junk: validate_result names a reason or the record loads as
    a certify.Record whose fields have their declared types (never a TypeError on --resume)."""
    d = _valid_record()
    for name, drop, value in edits:
        if drop:
            d.pop(name, None)
        else:
            d[name] = value
    why = dataset.validate_result(d)
    if why is None:
        r = dataset.record_from_json(d)
        assert isinstance(r.index, int) and isinstance(r.certified, bool) and isinstance(r.method, str)
        assert not r.certified or (r.correct and r.lower_margin > 0)
    else:
        assert isinstance(why, str) and why


def test_a_bad_eps_is_refused_before_anything_runs(tmp_path, capsys):
    """--eps -0.1 started the progress bar (and loaded the model) before failing (issue 32)."""
    assert softcert.cli.main(["certify", "--eps", "-0.1", "--n", "2", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "--eps: eps: must be finite and >= 0, got -0.1" in err and "%|" not in err
    assert not (tmp_path / "store.jsonl").exists()
