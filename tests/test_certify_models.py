"""The model family, its lowering to primitive nodes, data loaders and the zoo."""
import pytest
import torch
from torch import nn

from softcert.certify import check_supported, ops, trace, zoo
from softcert.certify.data import digits, mnist_local
from softcert.certify.models import ViT


def _graph_forward(g, z):
    vals = [z]
    for n in g.nodes[1:]:
        vals.append(ops.forward(n, [vals[j] for j in n.inputs]))
    return vals[-1]


@pytest.mark.parametrize("cfg", [
    dict(depth=1), dict(depth=2, layer_norm=True, pool="cls"), dict(depth=1, pool="cls"),
    dict(depth=2, layer_norm=True, norm_variance=False),
])
def test_graph_matches_model(cfg):
    torch.manual_seed(0)
    m = ViT(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, classes=3, **cfg).double().eval()
    x = torch.rand(5, 1, 4, 4, dtype=torch.float64)
    g = trace(m, x)
    torch.testing.assert_close(_graph_forward(g, x.unsqueeze(1)).squeeze(1), m(x), rtol=1e-12, atol=1e-12)


class _Ranker(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=-1).values


def test_unsupported_operator_named_with_its_module_path():
    m = ViT(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, classes=3)
    m.blocks[0].fc2 = nn.Sequential(nn.Linear(8, 8), _Ranker())
    with pytest.raises(ValueError, match=r"unsupported operator aten\.sort at 'blocks\.0\.fc2\.1' \(sort\)"):
        check_supported(m, torch.rand(1, 1, 4, 4))
    with pytest.raises(ValueError, match="output does not depend on the input"):
        check_supported(_Constant(), torch.rand(1, 4))


class _Constant(nn.Module):
    def forward(self, x):
        return torch.zeros_like(x)[:, :3] + 1.0


def test_zoo_loads_in_eval_mode_and_is_accurate():
    names = zoo.names()
    assert {"mnist-vit1", "mnist-vit2", "digits-vit1"} <= set(names)
    m, x, y = zoo.load("digits-vit1")
    assert not m.training
    with torch.no_grad():
        acc = (m(x).argmax(1) == y).float().mean().item()
    assert acc > 0.8
    m, x, y = zoo.load("mnist-vit1")
    assert m.tokens == 16 and m.config["dim"] == 32 and m.config["heads"] == 4 and m.config["mlp"] == 64
    with pytest.raises(ValueError, match="name"):
        zoo.load("nope")


def test_data_ranges_and_local_loader_never_downloads(tmp_path):
    xtr, ytr, xte, yte = digits()
    assert xtr.shape[1:] == (1, 8, 8) and 0 <= xtr.min() and xtr.max() <= 1
    assert len(xte) == 360 and len(set(yte.tolist())) == 10
    with pytest.raises(FileNotFoundError, match="never downloads"):
        mnist_local(tmp_path)


def test_idx_loader_roundtrip(tmp_path):
    import numpy as np

    root = tmp_path / "MNIST" / "raw"
    root.mkdir(parents=True)
    imgs = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    (root / "t10k-images-idx3-ubyte").write_bytes(
        bytes([0, 0, 8, 3]) + b"".join(int(d).to_bytes(4, "big") for d in imgs.shape) + imgs.tobytes())
    (root / "t10k-labels-idx1-ubyte").write_bytes(bytes([0, 0, 8, 1]) + (2).to_bytes(4, "big") + bytes([3, 7]))
    x, y = mnist_local(tmp_path, train=False)
    assert x.shape == (2, 1, 28, 28) and y.tolist() == [3, 7]
    assert x[0, 0, 0, 1].item() == pytest.approx(1 / 255)


def test_vit_from_config_or_fields():
    """ViT(ViTConfig(...)) and ViT(**fields) (how certify/zoo.py loads a checkpoint's config)
    build the same model; mixing the two, or a bad field, is a ValueError naming it."""
    from softcert.certify.models import ViTConfig

    fields = dict(image=[1, 4, 4], patch=2, dim=8, heads=2, mlp=8, classes=3, layer_norm=True, pool="cls")
    torch.manual_seed(0)
    a = ViT(ViTConfig(**fields))
    torch.manual_seed(0)
    b = ViT(**fields)
    assert a.config == b.config == dict(fields, image=(1, 4, 4), depth=1, norm_variance=True, branch_init="default")
    assert all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    with pytest.raises(ValueError, match="config"):
        ViT(ViTConfig(), dim=8)
    with pytest.raises(ValueError, match="config"):
        ViT(dict(fields))
    with pytest.raises(ValueError, match="patch"):
        ViT(image=(1, 4, 4), patch=3)
    with pytest.raises(ValueError, match="pool"):
        ViTConfig(pool="max")
    with pytest.raises(ValueError, match="norm_variance"):
        ViTConfig(layer_norm=True, norm_variance="no")


def test_centred_layer_norm_and_its_certificates():
    """norm_variance=False: every norm is (x - mean x)·w + b (no division by the standard
    deviation); certify's CROWN margins and the training IBP margins of such a model lie below
    the margins at 300 points of the box (the corners included)."""
    from softcert import certify
    from softcert.certify.models import CentredLayerNorm

    torch.manual_seed(1)
    m = ViT(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, classes=3, depth=2, layer_norm=True,
            norm_variance=False).double().eval()
    norms = [m.norm] + [b.norm1 for b in m.blocks] + [b.norm2 for b in m.blocks]
    assert all(isinstance(n, CentredLayerNorm) for n in norms)
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 2.0)
        m.norm.bias.uniform_(-1.0, 1.0)
    t = torch.randn(3, 5, 8, dtype=torch.float64) * 4
    expect = (t - t.mean(-1, keepdim=True)) * m.norm.weight + m.norm.bias
    torch.testing.assert_close(m.norm(t), expect, rtol=0, atol=1e-12)
    x = torch.rand(2, 1, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        y = m(x).argmax(1)
    eps = 0.02
    lo, hi = (x - eps).clamp(min=0), (x + eps).clamp(max=1)
    g = torch.Generator().manual_seed(0)
    pts = lo + (hi - lo) * torch.rand(300, *x.shape, generator=g, dtype=torch.float64)
    pts[:2] = torch.stack([lo, hi])
    with torch.no_grad():
        z = m(pts.reshape(-1, 1, 4, 4)).reshape(300, 2, 3)
    sampled = (z.gather(2, y[None, :, None].expand(300, 2, 1)) - z).amin(0)  # (2, 3), 0 at y
    others = torch.arange(3)[None, :] != y[:, None]
    crown = certify.verify(m, x, y, eps, method="crown").lower_margin
    assert crown.shape == (2, 3) and (crown <= sampled + 1e-12)[others].all()
    ibp = certify.margin_bounds(m, x, y, eps, "ibp")
    assert (ibp <= sampled + 1e-9).all()


def test_zero_branch_init_makes_every_block_the_identity():
    """branch_init="zero" zeroes each block's attention output and second MLP weights after the
    random draws: the other weights equal the default model's of the same seed, every block maps
    its input to itself, and a bad value is a ValueError naming the field."""
    from softcert.certify.models import ViTConfig

    fields = dict(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, classes=3, depth=2, layer_norm=True)
    torch.manual_seed(0)
    default = ViT(**fields)
    torch.manual_seed(0)
    zero = ViT(**fields, branch_init="zero")
    for k, v in zero.state_dict().items():
        zeroed = k.endswith(("attn.o.weight", "fc2.weight"))
        assert torch.equal(v, torch.zeros_like(v)) if zeroed else torch.equal(v, default.state_dict()[k]), k
    t = torch.randn(3, 4, 8)
    for blk in zero.blocks:
        assert torch.allclose(blk(t), t + blk.attn.o.bias + blk.fc2.bias)
    with pytest.raises(ValueError, match="branch_init"):
        ViTConfig(branch_init="small")


def test_zero_branch_init_keeps_interval_bounds_of_a_fresh_layernorm_vit_informative():
    """The measurement behind branch_init (docs/certify/training.md): a fresh 4-block LayerNorm
    ViT's IBP margin at eps 1e-4 is saturated with PyTorch's initialisation (its LayerNorms at
    their caps, far below the natural margin) and within 0.1 of the natural margin with zero
    branches; both lie below the natural margin (IBP is a lower bound)."""
    from softcert import certify
    from softcert.certify import zoo

    _, x, y = zoo.load("mnist-vit4")
    x, y = x[:4].float(), y[:4]
    gaps = {}
    for init in ("default", "zero"):
        torch.manual_seed(0)
        model = ViT(image=(1, 28, 28), patch=7, dim=64, heads=4, mlp=128, depth=4, layer_norm=True,
                    branch_init=init).eval()
        with torch.no_grad():
            z = model(x)
            natural = z.gather(1, y[:, None]) - z
            lower = certify.margin_bounds(model, x, y, 1e-4, "ibp")
        assert (lower <= natural + 1e-6).all()
        gaps[init] = float((natural - lower).max())
    assert gaps["zero"] < 0.1 < 10 < gaps["default"]


def test_grown_computes_the_same_function_with_the_same_interval_bounds():
    """grown(model, depth) adds copies of the first blocks with zero output layers: the same
    logits and the same IBP margins as the model; the copies' other weights are the source
    blocks'; a depth below L is a ValueError naming depth."""
    from softcert import certify
    from softcert.certify.models import grown

    torch.manual_seed(0)
    small = ViT(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, classes=3, depth=2, layer_norm=True).double().eval()
    big = grown(small, 3).eval()
    assert big.config["depth"] == 3 and next(big.parameters()).dtype == torch.float64
    assert torch.equal(big.blocks[2].attn.q.weight, small.blocks[0].attn.q.weight)
    assert not big.blocks[2].fc2.weight.any() and not big.blocks[2].attn.o.bias.any()
    x = torch.rand(5, 1, 4, 4, dtype=torch.float64)
    y = torch.tensor([0, 1, 2, 0, 1])
    with torch.no_grad():
        assert torch.equal(big(x), small(x))
        assert torch.equal(certify.margin_bounds(big, x, y, 0.01, "ibp"), certify.margin_bounds(small, x, y, 0.01, "ibp"))
    for bad in (1, 0, 2.5):
        with pytest.raises(ValueError, match="depth"):
            grown(small, bad)


def test_grown_past_twice_the_depth_is_growing_twice():
    """Block j of grown(model, depth) copies block j mod L for any depth >= L: growing 2 -> 8 at
    once gives the state of 2 -> 4 -> 8 (docs/certify/training.md, the 8-block chain inside the hour),
    and the same logits as the model."""
    from softcert.certify.models import grown

    torch.manual_seed(0)
    small = ViT(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, classes=3, depth=2, layer_norm=True).double().eval()
    once, twice = grown(small, 8).state_dict(), grown(grown(small, 4), 8).state_dict()
    assert once.keys() == twice.keys() and all(torch.equal(once[k], twice[k]) for k in once)
    assert torch.equal(once["blocks.7.attn.q.weight"], small.blocks[1].attn.q.weight)
    x = torch.rand(4, 1, 4, 4, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(grown(small, 7).eval()(x), small(x))
