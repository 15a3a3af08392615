"""``--device`` of softcert certify and bab (softcert.cli.devices): refused by name before
anything loads when the device does not exist here; on the CPU the same run as without it;
on a CUDA machine (when present) the same verdicts as on the CPU."""
import json

import pytest
import torch

from softcert.cli import devices, main

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


@pytest.mark.skipif(not NO_CUDA, reason="this machine has a CUDA device")
@pytest.mark.parametrize("command", [["certify", "--methods", "ibp"], ["bab", "--methods", "bab"]])
def test_cuda_without_a_gpu_is_refused_before_loading(command, capsys, tmp_path):
    argv = command + ["--model", "no-such-model", "--device", "cuda", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "no CUDA device" in err and "no-such-model" not in err


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
