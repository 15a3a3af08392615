"""kernels.placement.auto_backend: the kernel family "auto" picks for a device."""
import importlib.util

import torch

from softcert.kernels.placement import auto_backend


def test_cpu_data_takes_numba_and_cuda_data_triton_where_installed(monkeypatch):
    assert auto_backend(torch.device("cpu")) == "numba"
    installed = importlib.util.find_spec("triton") is not None
    assert auto_backend(torch.device("cuda")) == ("triton" if installed else "numba")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # triton not installed
    assert auto_backend(torch.device("cuda")) == "numba"
