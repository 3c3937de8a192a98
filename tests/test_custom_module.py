"""docs/custom_modules.md: a user's layer writing its gradient through Parameter.add_grad."""

import numpy as np
import pytest
import torch

import linearkit as lk


class Scale(lk.Module):
    """The docs' example: y = x * weight per feature, x (*, d) -> (*, d)."""

    def __init__(self, d):
        super().__init__()
        self.weight = lk.Parameter(np.ones(d, np.float32))

    def forward(self, x):
        return x * self.weight.data

    def vjp(self, x, input_grad=True):
        w = self.weight
        need_dw = w.requires_grad
        saved_x = x if need_dw else None

        def backward(dy):
            if need_dw:
                w.add_grad(np.sum(dy * saved_x, axis=tuple(range(dy.ndim - 1))))
            return dy * w.data if input_grad else None

        return x * w.data, backward


@pytest.mark.parametrize("shape", [(4,), (5, 4), (2, 3, 4)])
def test_scale_gradients_match_torch_and_accumulate(shape):
    rng = np.random.default_rng(0)
    layer = Scale(4)
    layer.weight.data[...] = rng.standard_normal(4)
    x = rng.standard_normal(shape).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    wt = torch.from_numpy(layer.weight.data.copy()).requires_grad_()
    xt = torch.from_numpy(x).requires_grad_()
    (xt * wt).backward(torch.from_numpy(dy))
    for _ in range(2):  # used twice: the contributions add up
        _, back = layer.vjp(x)
        dx = back(dy)
    torch.testing.assert_close(torch.from_numpy(dx), xt.grad)
    torch.testing.assert_close(torch.from_numpy(layer.weight.grad), 2 * wt.grad)
    layer.zero_grad(set_to_none=False)
    buffer = layer.weight.grad
    layer.vjp(x)[1](dy)
    assert layer.weight.grad is buffer  # the zeroed buffer is overwritten, not replaced
    torch.testing.assert_close(torch.from_numpy(buffer), wt.grad)


def test_add_grad_write_form_gets_the_right_destination():
    p = lk.Parameter(np.zeros((2, 3)))
    calls = []

    def write(out, accumulate):
        calls.append((out is None, accumulate))
        value = np.ones((2, 3))
        if out is None:
            return value
        if accumulate:
            out += value
        else:
            out[...] = value
        return out

    p.add_grad(write=write)
    p.add_grad(write=write)
    assert (p.grad == 2).all()
    p.zero_grad(set_to_none=False)
    p.add_grad(write=write)
    assert (p.grad == 1).all() and calls == [(True, False), (False, True), (False, False)]
    with pytest.raises(TypeError, match="needs a gradient array"):
        p.add_grad()

