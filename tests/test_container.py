"""Sequential and Residual: indexing, slicing, editing, errors, gradients vs torch."""

from collections import OrderedDict

import numpy as np
import pytest
import torch

import linearkit as lk


def test_sequential_indexing_slicing_len_append_insert():
    a, b, c = lk.Linear(2, 3), lk.ReLU(), lk.Linear(3, 1)
    seq = lk.Sequential(a, b)
    assert len(seq) == 2 and seq[0] is a and seq[-1] is b
    seq.append(c)
    assert seq[2] is c and list(seq) == [a, b, c]
    head = seq[:2]
    assert isinstance(head, lk.Sequential) and len(head) == 2 and head[0] is a
    assert repr(seq[1:]) == repr(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU(),
                                                     torch.nn.Linear(3, 1))[1:])
    seq.insert(1, lk.Identity())
    assert [n for n, _ in seq.named_children()] == ["0", "1", "2", "3"] and isinstance(seq[1], lk.Identity)
    seq[1] = lk.Tanh()
    assert isinstance(seq[1], lk.Tanh)
    with pytest.raises(IndexError, match="out of range"):
        seq[10]
    named = lk.Sequential(OrderedDict([("fc", lk.Linear(2, 2)), ("act", lk.ReLU())]))
    assert list(named.state_dict()) == ["fc.weight", "fc.bias"]


@pytest.mark.parametrize("index", [1, -1, 0, slice(1, 3), slice(None, None, 2), slice(5, 9)])
def test_del_and_pop_renumber_as_torch_does(index):
    ours = lk.Sequential(OrderedDict([("fc", lk.Linear(2, 3)), ("act", lk.ReLU()),
                                      ("out", lk.Linear(3, 3)), ("tanh", lk.Tanh())]))
    theirs = torch.nn.Sequential(OrderedDict([("fc", torch.nn.Linear(2, 3)),
                                              ("act", torch.nn.ReLU()),
                                              ("out", torch.nn.Linear(3, 3)),
                                              ("tanh", torch.nn.Tanh())]))
    kept = [m for i, m in enumerate(ours) if i not in range(4)[index]
            ] if isinstance(index, slice) else [m for i, m in enumerate(ours) if i != index % 4]
    del ours[index]
    del theirs[index]
    assert list(ours) == kept
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert all(getattr(ours, str(i)) is m for i, m in enumerate(ours))
    assert not hasattr(ours, str(len(ours))) and not hasattr(ours, "fc")
    if len(ours):
        last = ours[-1]
        assert ours.pop() is last and type(theirs.pop(-1)).__name__ == type(last).__name__
        assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    with pytest.raises(IndexError, match="out of range"):
        del ours[7]


def test_residual_gradients_match_torch_and_shape_error():
    rng = np.random.default_rng(0)
    inner = lk.Linear(4, 4, dtype=np.float64, rng=rng)
    block = lk.Residual(inner)
    x, dy = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    y, backward = block.vjp(x)
    dx = backward(dy)
    t = torch.nn.Linear(4, 4).double()
    t.load_state_dict({k: torch.from_numpy(v) for k, v in inner.state_dict().items()})
    xt = torch.from_numpy(x).requires_grad_()
    (xt + t(xt)).backward(torch.from_numpy(dy))
    torch.testing.assert_close(torch.from_numpy(dx), xt.grad)
    torch.testing.assert_close(torch.from_numpy(inner.weight.grad), t.weight.grad)
    with pytest.raises(lk.ShapeError, match="residual connection needs them equal"):
        lk.Residual(lk.Linear(4, 2))(np.ones((1, 4), np.float32))
    _, backward = block.vjp(x, input_grad=False)
    assert backward(dy) is None


def test_error_inside_nested_containers_names_the_full_path():
    model = lk.Sequential(OrderedDict([
        ("features", lk.Sequential(lk.Linear(4, 4), lk.ReLU())),
        ("classifier", lk.Sequential(lk.Linear(4, 4), lk.ReLU(), lk.Linear(8, 2))),
    ]))
    with pytest.raises(lk.ShapeError, match=r"'classifier.2' \(Linear\(in_features=8"):
        model(np.ones((1, 4), np.float32))
    with pytest.raises(lk.ShapeError, match=r"'classifier.2'"):
        model.vjp(np.ones((1, 4), np.float32))
