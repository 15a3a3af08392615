"""certify.train: the zoo's natural recipes and their overrides (epochs, shift)."""
import pytest
import torch

from softcert.certify import train


@pytest.mark.parametrize("kwargs, name", [
    (dict(epochs=0), "epochs"), (dict(epochs=1.5), "epochs"), (dict(shift=-1), "shift"), (dict(shift=0.5), "shift"),
])
def test_bad_overrides_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        train.train("digits-vit1", **kwargs)


def test_unknown_recipe_names_the_argument():
    with pytest.raises(ValueError, match="^name:"):
        train.train("no-such-vit")


def test_shift_changes_what_the_model_sees_and_nothing_else():
    def weights(**kw):
        return torch.cat([p.detach().flatten() for p in train.train("digits-vit1", epochs=1, **kw).parameters()])

    plain, again, moved = weights(), weights(shift=0), weights(shift=1)
    assert torch.equal(plain, again)  # shift 0 draws nothing: the zoo's recipes are unchanged
    assert torch.isfinite(moved).all() and not torch.equal(plain, moved)
