"""kernels.threads: a Numba parallel launch leaves the caller's torch thread count alone."""
import numpy as np
import pytest
import torch

from softcert.kernels import attention, fp_rows, topk, vertex
from softcert.kernels.floating import Q32, U32
from softcert.kernels.threads import caller_threads

RNG = np.random.default_rng(0)
S = RNG.normal(size=(64, 32))


def _vertex():
    lo = S - 0.1
    vertex.vertex_bounds(RNG.normal(size=S.shape), lo, lo + 0.2)


def _attention():
    q, k, v = (RNG.normal(size=(4, 8, 16)).astype(np.float32) for _ in range(3))
    attention.flash_attention(q, k, v, 4, U32, 2 * U32, Q32)


def _fp_rows():
    fp_rows.rows_report(S.astype(np.float32))


def _topk():
    t = torch.as_tensor(S)
    topk.certify_rows_numba(t, 0.1)
    topk.tail_mass_numba(t, 4)
    topk.gap_bound_numba(t, 4)
    topk.multi_gap_bound_numba(t, 4)


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("launch", [_vertex, _attention, _fp_rows, _topk], ids=lambda f: f.__name__[1:])
def test_parallel_kernels_keep_torch_threads(one_thread, launch):
    # on a machine with >= 2 cores and Numba's "omp" layer a bare launch sets torch to Numba's
    # thread count (1 -> 2 on the 2-core machine)
    launch()
    assert torch.get_num_threads() == 1


def test_caller_threads_restores_a_change_inside(one_thread):
    with caller_threads():
        torch.set_num_threads(2)
    assert torch.get_num_threads() == 1
