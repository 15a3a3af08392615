"""``--device`` of softcert certify, bab, report, vnncomp and vnnlib verify
(softcert.cli.devices): refused by name before anything loads when the device does not exist
here; on the CPU the same run as without it; on a CUDA machine (when present) the same
verdicts as on the CPU; Dask workers spread over the CUDA devices (``worker_device``)."""
import json

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from softcert.cli import dataset, devices, main

NO_CUDA = not torch.cuda.is_available()


@pytest.mark.parametrize("value, word", [("bogus", "not a device"), ("meta", "only cpu and cuda"),
                                         ("cuda:99", "CUDA")])
def test_bad_devices_are_named(value, word):
    if value == "cuda:99" and NO_CUDA:
        word = "no CUDA device"
    with pytest.raises(ValueError, match=word) as e:
        devices.device_of(value)
    assert "--device" in str(e.value)


def test_default_is_the_cpu():
    assert devices.device_of(None) == torch.device("cpu") == devices.device_of("cpu")


def _commands(tmp_path):
    """Each bounding command with inputs that do not exist (no-such-model*): a --device error
    must come before any of them is read."""
    missing = str(tmp_path / "no-such-model.onnx")
    return {"certify": ["certify", "--methods", "ibp", "--model", "no-such-model", "--out", str(tmp_path)],
            "bab": ["bab", "--methods", "bab", "--model", "no-such-model", "--out", str(tmp_path)],
            "report": ["report", "--tiny", "--model", "no-such-model", "--out", str(tmp_path)],
            "vnncomp": ["vnncomp", missing, str(tmp_path / "no-such-model.vnnlib"), "--timeout", "30",
                        "--out", str(tmp_path / "result.txt")],
            "vnnlib": ["vnnlib", "verify", str(tmp_path / "no-such-model.vnnlib"), "--network", f"net={missing}"]}


COMMANDS = ("certify", "bab", "report", "vnncomp", "vnnlib")


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA device")
@pytest.mark.parametrize("command", COMMANDS)
def test_cuda_without_a_gpu_is_refused_before_loading(command, capsys, tmp_path):
    assert main(_commands(tmp_path)[command] + ["--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "no CUDA device" in err and "no-such-model" not in err
    assert "Traceback" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_bad_device_is_refused_by_name(command, capsys, tmp_path):
    assert main(_commands(tmp_path)[command] + ["--device", "gpu0"]) == 2
    err = capsys.readouterr().err
    assert "--device: 'gpu0' is not a device" in err and "no-such-model" not in err


@pytest.mark.parametrize("command", COMMANDS)
def test_help_lists_the_device(command, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(_commands(tmp_path)[command][:2 if command == "vnnlib" else 1] + ["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert e.value.code == 0 and "--device DEVICE" in out and "cpu, cuda or cuda:N" in out
    if command in ("certify", "report"):  # the commands with --workers say how workers share GPUs
        assert "worker i bounds on cuda:(i mod the number of CUDA devices)" in out and "share cuda:0" in out


def test_on_the_cpu_the_run_and_its_command_line_carry_the_device(tmp_path):
    argv = ["certify", "--model", "mnist-vit1", "--eps", "0.01", "--methods", "ibp", "--n", "1",
            "--device", "cpu", "--out", str(tmp_path)]
    assert main(argv) == 0
    res = json.loads((tmp_path / "results.json").read_text())
    assert "--device cpu" in res["command"]


def test_the_loaded_model_stays_where_it_was():
    model = torch.nn.Linear(2, 2)
    x, y = torch.zeros(1, 2), torch.zeros(1, dtype=torch.int64)
    m, xd, yd = devices.on_device(model, x, y, torch.device("cpu"))
    assert m is model and xd.device.type == "cpu"


@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
def test_on_cuda_the_verdicts_match_the_cpu():
    from softcert import certify
    from softcert.certify import zoo

    model, x, y = zoo.load("mnist-vit1")
    cpu = certify.verify(model, x[:4], y[:4], 0.005, method="crown")
    m, xd, yd = devices.on_device(model, x[:4], y[:4], torch.device("cuda"))
    gpu = certify.verify(m, xd, yd, 0.005, method="crown")
    assert next(model.parameters()).device.type == "cpu"
    assert gpu.lower_margin.device.type == "cuda"
    # not bit for bit (another summation order): within a rounding margin far below the bound's
    gap = (gpu.lower_margin.cpu() - cpu.lower_margin).abs()
    assert (gap <= 1e-8 * (1 + cpu.lower_margin.abs())).all()
    clear = cpu.lower_margin.abs() > 1e-6
    assert torch.equal(gpu.certified.cpu()[clear], cpu.certified[clear])


# ---------------------------------------------------------------- Dask workers
@pytest.mark.parametrize("index, count, want", [(0, 2, "cuda:0"), (1, 2, "cuda:1"), (2, 2, "cuda:0"),
                                                (5, 3, "cuda:2"), (0, 1, "cuda:0"), (3, 1, "cuda:0")])
def test_worker_i_takes_cuda_i_mod_count(index, count, want):
    assert devices.worker_device(torch.device("cuda"), index, count) == torch.device(want)


def test_workers_keep_the_cpu_an_explicit_gpu_and_an_unindexed_device():
    cpu, cuda1 = torch.device("cpu"), torch.device("cuda:1")
    assert devices.worker_device(cpu, 3, 2) == cpu
    assert devices.worker_device(cuda1, 0, 2) == cuda1  # cuda:N: every worker there
    assert devices.worker_device(torch.device("cuda"), None, 2) == torch.device("cuda")  # not on a worker


def test_a_worker_without_gpus_is_refused_by_name():
    with pytest.raises(ValueError, match="--device cuda: this Dask worker sees no CUDA device"):
        devices.worker_device(torch.device("cuda"), 0, 0)


def test_worker_device_counts_the_devices_by_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert devices.worker_device(torch.device("cuda"), 4, None) == torch.device("cuda:1")


def test_in_process_tasks_have_no_worker_index():
    assert dataset.worker_index() is None
    assert dataset.task_device(dataset.Job(("digits-vit1",), (0.01,), ("ibp",), 1)) == torch.device("cpu")


def test_each_worker_of_a_local_cluster_takes_its_own_gpu(monkeypatch):
    """A LocalCluster names its workers 0..N-1: with two CUDA devices (simulated: the workers
    are threads of this process, where torch.cuda is patched) worker i bounds on cuda:i; with
    one, both share cuda:0."""
    distributed = pytest.importorskip("distributed")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    job = dataset.Job(("digits-vit1",), (0.01,), ("ibp",), 1, device="cuda")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                                  dashboard_address=None, scheduler_kwargs={"dashboard_address": "127.0.0.1:0"}) \
            as cluster, distributed.Client(cluster) as client:
        workers = sorted(client.scheduler_info()["workers"].items(), key=lambda kv: kv[1]["name"])
        assert [w["name"] for _, w in workers] == [0, 1]
        for count, want in ((2, ["cuda:0", "cuda:1"]), (1, ["cuda:0", "cuda:0"])):
            monkeypatch.setattr(torch.cuda, "device_count", lambda count=count: count)
            got = [client.submit(dataset.task_device, job, workers=[address], pure=False).result()
                   for address, _ in workers]
            assert [str(d) for d in got] == want


# ---------------------------------------------------------------- the ONNX commands
def _onnx_mlp(path):
    """A 3-8-3 ReLU network written with onnx.helper (no export: fast), seeded weights."""
    rng = np.random.default_rng(0)
    w1, b1 = rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=8).astype(np.float32)
    w2, b2 = rng.normal(size=(3, 8)).astype(np.float32), rng.normal(size=3).astype(np.float32)
    inits = [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
    nodes = [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 3))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 3))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path.write_bytes(model.SerializeToString())
    x0 = np.array([0.3, -0.2, 0.5])
    y0 = w2.astype(np.float64) @ np.maximum(w1.astype(np.float64) @ x0 + b1, 0) + b2
    return path, x0, int(np.argmax(y0))


def _robustness(x0, eps, label, version="1.0"):
    """Some other class scores >= ``label`` within ``eps`` of x0 (3 inputs, 3 outputs)."""
    if version == "1.0":
        text = "".join(f"(declare-const X_{i} Real)\n" for i in range(3))
        text += "".join(f"(declare-const Y_{j} Real)\n" for j in range(3))
        X, Y = (lambda i: f"X_{i}"), (lambda j: f"Y_{j}")
    else:
        text = "(vnnlib-version <2.0>)\n(declare-network net (declare-input X real [3]) (declare-output Y real [3]))\n"
        X, Y = (lambda i: f"X[{i}]"), (lambda j: f"Y[{j}]")
    for i in range(3):
        text += f"(assert (>= {X(i)} {float(x0[i]) - eps!r}))\n(assert (<= {X(i)} {float(x0[i]) + eps!r}))\n"
    text += "(assert (or " + " ".join(f"(and (>= {Y(j)} {Y(label)}))" for j in range(3) if j != label) + "))\n"
    return text


@pytest.fixture(scope="module")
def onnx_mlp(tmp_path_factory):
    return _onnx_mlp(tmp_path_factory.mktemp("onnx") / "mlp.onnx")


@pytest.mark.parametrize("eps, word", [(0.01, "unsat"), (2.0, "sat")])
def test_vnncomp_on_the_cpu_writes_what_it_writes_without_the_flag(onnx_mlp, tmp_path, eps, word):
    path, x0, label = onnx_mlp
    prop = tmp_path / "p.vnnlib"
    prop.write_text(_robustness(x0, eps, label))
    texts = []
    for extra in ([], ["--device", "cpu"]):
        out = tmp_path / f"result{len(texts)}.txt"
        assert main(["vnncomp", str(path), str(prop), "--timeout", "60", "--out", str(out), *extra]) == 0
        texts.append(out.read_text())
    assert texts[0].split("\n")[0] == word and texts[0] == texts[1]  # a sat counterexample too, digit for digit
    assert "--device cpu" in json.loads((tmp_path / "result1.txt.json").read_text())["command"]


@pytest.mark.parametrize("eps, word", [(0.01, "unsat"), (2.0, "sat")])
def test_vnnlib_verify_on_the_cpu_prints_what_it_prints_without_the_flag(onnx_mlp, tmp_path, capsys, eps, word):
    path, x0, label = onnx_mlp
    prop = tmp_path / "p.vnnlib"
    prop.write_text(_robustness(x0, eps, label, "2.0"))
    said = []
    for extra in ([], ["--device", "cpu"]):
        assert main(["vnnlib", "verify", str(prop), "--network", f"net={path}", "--timeout", "60", *extra]) == 0
        said.append(capsys.readouterr().out)
    assert said[0].split("\n")[0] == word and said[0] == said[1]


def test_the_graph_moves_and_the_file_stays(onnx_mlp):
    from softcert.certify.onnx_graph import read_onnx

    net = read_onnx(onnx_mlp[0])
    assert net.to("cpu") is net  # already there: nothing copied
    moved = net.to("meta")  # a device without values: shows where every constant went
    assert moved.graph.device == torch.device("meta") and net.graph.device == torch.device("cpu")
    assert all(t.device.type == "meta" for n in moved.graph.nodes for t in n.params.values()
               if isinstance(t, torch.Tensor))
    assert moved.model is net.model  # onnxruntime's model, on the CPU


@pytest.mark.parametrize("method", ["crown", "bab"])
def test_solve_on_the_cpu_is_solve_without_a_device(onnx_mlp, method):
    from softcert.certify.onnx_graph import read_onnx
    from softcert.certify.vnncomp import solve
    from softcert.certify.vnnlib import parse_vnnlib

    path, x0, label = onnx_mlp
    net = read_onnx(path)
    for eps in (0.01, 0.3, 2.0):
        prop = parse_vnnlib(_robustness(x0, eps, label))
        a, b = solve(net, prop, 30, method), solve(net, prop, 30, method, device="cpu")
        assert (a.result, a.counterexample, a.boxes) == (b.result, b.counterexample, b.boxes)


def test_solve_names_a_bad_device(onnx_mlp):
    from softcert.certify.onnx_graph import read_onnx
    from softcert.certify.vnncomp import solve
    from softcert.certify.vnnlib import parse_vnnlib

    path, x0, label = onnx_mlp
    with pytest.raises(ValueError, match="device: 'gpu0' is not a device"):
        solve(read_onnx(path), parse_vnnlib(_robustness(x0, 0.01, label)), 5, device="gpu0")


def test_report_certify_stage_on_the_cpu_gives_the_same_records():
    from dataclasses import replace

    from softcert.cli.commands import report

    model, x, y, _ = dataset.load("digits-vit1")
    st = replace(report.TINY, n_images=2, methods=("ibp", "crown"), vertex_rows=2)
    a, b = [], []
    sa = report.stage_certify(model, x[:2], y[:2], st, a)
    sb = report.stage_certify(model, x[:2], y[:2], st, b, device=torch.device("cpu"))
    timing = ("seconds_per_image",)
    assert [{k: v for k, v in r.items() if k not in timing} for r in sa["rows"]] == \
        [{k: v for k, v in r.items() if k not in timing} for r in sb["rows"]]
    assert a == b and [r for r in a if r["kind"] == "vertex"]


@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["crown", "vertex", "bab"])
def test_solve_on_cuda_gives_the_cpu_verdicts(onnx_mlp, method):
    """On a GPU: the same words; a sat counterexample onnxruntime confirmed (in solve) lies in the box."""
    from softcert.certify.onnx_graph import read_onnx
    from softcert.certify.vnncomp import solve
    from softcert.certify.vnnlib import parse_vnnlib

    path, x0, label = onnx_mlp
    net = read_onnx(path)
    for eps in (0.01, 2.0):
        prop = parse_vnnlib(_robustness(x0, eps, label))
        cpu, gpu = solve(net, prop, 60, method), solve(net, prop, 60, method, device="cuda")
        assert gpu.result == cpu.result
        if gpu.result == "sat":
            assert prop.regions[0].contains(np.array(gpu.counterexample[0], dtype=np.float32))
