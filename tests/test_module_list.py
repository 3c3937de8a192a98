"""ModuleList / ModuleDict against PyTorch's, the list-of-modules attribute error, and their rules
(the ledger, model files, to_torch/from_torch)."""

from collections import OrderedDict

import numpy as np
import pytest

import linearkit as lk

torch = pytest.importorskip("torch")
nn = torch.nn


def _pair(n=3):
    """The same ModuleList of Linear(2, 2)s on both sides (ids kept for sharing checks)."""
    lk.manual_seed(0)
    return lk.ModuleList([lk.Linear(2, 2) for _ in range(n)]), nn.ModuleList(
        [nn.Linear(2, 2) for _ in range(n)])


def _names(m):
    return list(m.state_dict())


def test_module_list_registers_indexes_and_slices_as_torch():
    ml, tl = _pair(3)
    assert _names(ml) == _names(tl) == ["0.weight", "0.bias", "1.weight", "1.bias",
                                        "2.weight", "2.bias"]
    assert len(ml) == len(tl) == 3
    assert ml[-1] is list(ml)[2] and ml[0] is ml._modules["0"]
    part = ml[1:]
    assert type(part) is lk.ModuleList and len(part) == len(tl[1:]) == 2
    assert part[0] is ml[1]                       # shared, not copied
    assert _names(part) == _names(tl[1:])
    for bad in (3, -4):
        with pytest.raises(IndexError):
            tl[bad]
        with pytest.raises(IndexError):
            ml[bad]
    with pytest.raises(TypeError):
        tl["a"]
    with pytest.raises(TypeError):
        ml["a"]
    assert len(list(ml.parameters())) == len(list(tl.parameters())) == 6


def test_module_list_edits_renumber_as_torch():
    ml, tl = _pair(4)
    lin, tlin = lk.Linear(2, 3), nn.Linear(2, 3)
    for m, new in ((ml, lin), (tl, tlin)):
        del m[1]
        m.insert(1, new)
        m.append(type(new)(2, 2))
        m += [type(new)(2, 1)]
        m.extend([type(new)(1, 1)])
        m[0] = type(new)(2, 4)
        del m[-2:]
        m.pop(0)
    assert _names(ml) == _names(tl)
    assert [tuple(p.shape) for p in ml.parameters()] == [tuple(p.shape) for p in tl.parameters()]
    assert ml[0] is lin
    assert sorted(ml._modules) == [str(i) for i in range(len(ml))]
    with pytest.raises(TypeError, match="iterable"):
        ml.extend(3)
    both = ml + lk.ModuleList([lk.ReLU()])
    assert len(both) == len(ml) + 1 and both[0] is ml[0]


def test_module_list_repr_matches_torch():
    lk_list = lk.ModuleList([lk.Linear(2, 2), lk.Linear(2, 2), lk.ReLU(), lk.Linear(2, 3)])
    torch_list = nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 3)])
    assert repr(lk_list) == repr(torch_list)
    assert repr(lk.ModuleList()) == repr(nn.ModuleList())
    assert repr(lk.ModuleDict({"a": lk.ReLU()})) == repr(nn.ModuleDict({"a": nn.ReLU()}))


def test_they_are_not_callable_as_torch():
    x = np.zeros((1, 2), np.float32)
    with pytest.raises(NotImplementedError):
        nn.ModuleList([nn.Linear(2, 2)])(torch.zeros(1, 2))
    for m in (lk.ModuleList([lk.Linear(2, 2)]), lk.ModuleDict({"a": lk.Linear(2, 2)})):
        with pytest.raises(NotImplementedError, match="forward"):
            m(x)
        with pytest.raises(NotImplementedError):
            m.vjp(x)


def test_module_dict_as_torch():
    lk.manual_seed(1)
    md = lk.ModuleDict(OrderedDict([("b", lk.Linear(2, 3)), ("a", lk.ReLU())]))
    td = nn.ModuleDict(OrderedDict([("b", nn.Linear(2, 3)), ("a", nn.ReLU())]))
    assert list(md) == list(td) == list(md.keys()) == ["b", "a"]
    assert _names(md) == _names(td) == ["b.weight", "b.bias"]
    assert "b" in md and "z" not in md and ("b" in td)
    for m, lin in ((md, lk.Linear(3, 1)), (td, nn.Linear(3, 1))):
        m.update([("c", lin)])
        m["d"] = type(lin)(1, 1)
        del m["a"]
        m.pop("d")
    assert _names(md) == _names(td)
    assert [k for k, _ in md.items()] == list(td.keys())
    assert list(md.values())[0] is md["b"]
    with pytest.raises(KeyError):
        md["zz"]
    with pytest.raises(TypeError, match="iterable"):
        md.update(3)
    with pytest.raises(ValueError, match="length"):
        md.update([("x", lk.ReLU(), 1)])
    with pytest.raises(TypeError):
        td.update(3)
    md.clear()
    td.clear()
    assert len(md) == len(td) == 0 and _names(md) == []


class Stack(lk.Module):
    """x (*, 2) -> y (*, 2): ``layers`` applied in a loop, each ``tanh(Linear)``."""

    def __init__(self, n=3):
        super().__init__()
        self.layers = lk.ModuleList([lk.Linear(2, 2) for _ in range(n)])
        self.act = lk.Tanh()

    def forward(self, x):
        for layer in self.layers:
            x = self.act(layer(x))
        return x

    def vjp(self, x, input_grad=True):
        backs = []
        for i, layer in enumerate(self.layers):
            x, b1 = layer.vjp(x, input_grad=input_grad or i > 0)
            x, b2 = self.act.vjp(x)
            backs += [b1, b2]

        def backward(dy):
            for b in reversed(backs):
                dy = b(dy)
            return dy

        return x, backward


def test_a_custom_module_loops_over_its_module_list_and_trains():
    lk.manual_seed(2)
    model = Stack()
    twin = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)])
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in
                          model.layers.state_dict().items()})
    assert _names(model) == ["layers." + k for k in _names(twin)]
    assert len(list(model.parameters())) == 6
    x = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float32)
    y, back = model.vjp(x)
    tx = torch.from_numpy(x)
    ty = tx
    for layer in twin:
        ty = torch.tanh(layer(ty))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-5, atol=1e-6)
    back(np.ones_like(y))
    ty.sum().backward()
    np.testing.assert_allclose(model.layers[0].weight.grad, twin[0].weight.grad.numpy(),
                               rtol=1e-5, atol=1e-6)
    before = model.layers[2].weight.data.copy()
    lk.optim.SGD(model.parameters(), lr=0.1).step()
    assert not np.array_equal(before, model.layers[2].weight.data)


def test_the_ledger_counts_a_module_list_held_by_a_custom_module():
    model = Stack()
    report = lk.analysis.ledger(model, (4, 2))
    text = str(report)
    assert "layers.0" in text and "layers.2" in text
    total = sum(p.numel() for p in model.parameters())
    assert str(total) in text
    tree = lk.analysis.ledger(lk.ModuleList([lk.Linear(2, 3), lk.Linear(3, 1)]))
    assert "0" in str(tree)


@pytest.mark.parametrize("value", [[lk.Linear(2, 2)], (lk.ReLU(), 3), {"a": lk.Linear(2, 2)}])
def test_a_plain_container_of_modules_is_refused_naming_the_fix(value):
    class Holder(lk.Module):
        def __init__(self):
            super().__init__()
            self.layers = value

    fix = "ModuleDict" if isinstance(value, dict) else "ModuleList"
    with pytest.raises(TypeError, match=rf"'layers' is a {type(value).__name__} .*{fix}"):
        Holder()


def test_plain_containers_without_modules_stay_allowed():
    m = lk.Module()
    m.sizes, m.names, m.empty, m.opts = [1, 2], ("a",), [], {"lr": 0.1}
    assert m.sizes == [1, 2] and m.empty == [] and m.opts == {"lr": 0.1}
    assert list(m.parameters()) == []


def test_torch_checkpoints_of_the_same_tree_load():
    lk_model = lk.ModuleDict({"enc": lk.Linear(2, 3), "heads": lk.ModuleList([lk.Linear(3, 1)])})
    torch_model = nn.ModuleDict({"enc": nn.Linear(2, 3), "heads": nn.ModuleList([nn.Linear(3, 1)])})
    assert _names(lk_model) == _names(torch_model)
    lk_model.load_state_dict({k: v.detach() for k, v in torch_model.state_dict().items()})
    for key, value in torch_model.state_dict().items():
        np.testing.assert_array_equal(lk_model.state_dict()[key], value.detach().numpy())


def test_model_files_rebuild_them(tmp_path):
    lk.manual_seed(5)
    model = lk.ModuleDict({"enc": lk.Linear(2, 3), "heads": lk.ModuleList(
        [lk.Linear(3, 1), lk.ReLU(), lk.Linear(3, 2)])})
    path = tmp_path / "m.lk"
    lk.save(model, path)
    again = lk.load_model(path)
    assert type(again) is lk.ModuleDict and type(again["heads"]) is lk.ModuleList
    assert repr(again) == repr(model)
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(again.state_dict()[key], value)
    for other in (lk.ModuleList(), lk.ModuleDict(),
                  lk.ModuleList([lk.Linear(2, 2, dtype=np.float64)]),
                  lk.Sequential(lk.Linear(2, 2), lk.ModuleDict({"z": lk.Tanh()}))):
        lk.save(other, path)
        again = lk.load_model(path)
        assert type(again) is type(other) and repr(again) == repr(other)
        _same_weights(again, other)


# ------------------------------------------------------------------ torch twins
def _same_weights(a, b):
    """``a`` and ``b`` (either side's) hold the same keys, in order, with equal values."""
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    for key in sa:
        np.testing.assert_array_equal(np.asarray(sa[key]), np.asarray(sb[key]), err_msg=key)


def test_to_torch_makes_torch_containers_and_from_torch_gives_them_back():
    from linearkit.io import from_torch, to_torch

    lk.manual_seed(6)
    shared = lk.Linear(3, 3, dtype=np.float64)
    model = lk.ModuleDict({"enc": lk.Linear(2, 3, dtype=np.float64), "heads": lk.ModuleList(
        [shared, lk.ReLU(), shared, lk.Linear(3, 2, dtype=np.float64)])})
    model["heads"][3].weight.requires_grad = False
    model["enc"].eval()
    tm = to_torch(model)
    assert type(tm) is nn.ModuleDict and type(tm["heads"]) is nn.ModuleList
    assert list(tm) == ["enc", "heads"] and repr(tm) == repr(model)
    assert tm["heads"][0] is tm["heads"][2]                      # still one module
    assert tm["heads"][0].weight.dtype == torch.float64
    assert not tm["heads"][3].weight.requires_grad and not tm["enc"].training
    _same_weights(model, tm)
    back = from_torch(tm)
    assert type(back) is lk.ModuleDict and type(back["heads"]) is lk.ModuleList
    assert back["heads"][0] is back["heads"][2] and repr(back) == repr(model)
    assert not back["heads"][3].weight.requires_grad and not back["enc"].training
    _same_weights(back, model)
    bare = lk.ModuleList([lk.Linear(2, 3), lk.Linear(3, 1)])
    assert type(to_torch(bare)) is nn.ModuleList and type(from_torch(to_torch(bare))) is \
        lk.ModuleList
    _same_weights(from_torch(to_torch(bare)), bare)
    assert len(to_torch(lk.ModuleList())) == 0 and len(from_torch(nn.ModuleDict())) == 0


class Heads(lk.Module):
    """x (*, 2) -> y (*, 3): ``relu(trunk(x))`` into each head of a ModuleList, concatenated."""

    def __init__(self, trunk=None, heads=None):
        super().__init__()
        self.trunk = trunk if trunk is not None else lk.Linear(2, 4)
        self.heads = heads if heads is not None else lk.ModuleList(
            [lk.Linear(4, 1), lk.Linear(4, 2)])

    def forward(self, x):
        h = np.maximum(self.trunk(x), 0)
        return np.concatenate([head(h) for head in self.heads], axis=-1)


class TorchHeads(nn.Module):
    """The torch twin of ``Heads``: the same children under the same names."""

    def __init__(self, trunk, heads):
        super().__init__()
        self.trunk, self.heads = trunk, heads

    def forward(self, x):
        h = torch.relu(self.trunk(x))
        return torch.cat([head(h) for head in self.heads], dim=-1)


def test_a_custom_module_holding_a_module_list_round_trips_once_its_rule_names_a_twin():
    from linearkit.io import from_torch, to_torch
    from linearkit.rules import LayerRule, TorchTwin, register_rule

    lk.manual_seed(7)
    model = Heads()
    with pytest.raises(lk.FormatError, match=r"root linearkit module \(Heads\) has no torch"):
        to_torch(model)                                          # no rule: no twin
    twin = TorchTwin(f"{__name__}.TorchHeads",
                     build=lambda cls, children: cls(children["trunk"], children["heads"]))
    with register_rule(Heads, LayerRule(kind="heads", torch=twin)):
        tm = to_torch(model)
        assert type(tm) is TorchHeads and type(tm.heads) is nn.ModuleList
        _same_weights(model, tm)
        x = np.random.default_rng(0).standard_normal((5, 2)).astype(np.float32)
        with torch.no_grad():
            np.testing.assert_allclose(tm(torch.from_numpy(x)).numpy(), model(x), rtol=1e-6,
                                       atol=1e-6)
        back = from_torch(tm)
        assert type(back) is Heads and type(back.heads) is lk.ModuleList
        _same_weights(back, model)
        np.testing.assert_array_equal(back(x), model(x))
