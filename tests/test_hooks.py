"""Call hooks: PyTorch's shape (pre/forward/backward, removable handles), checked against torch."""

import pathlib
import re

import numpy as np
import pytest
import torch

import linearkit as lk


def _pair(seed=0):
    """A linearkit MLP and the same MLP in torch."""
    lk.manual_seed(seed)
    ours = lk.Sequential(lk.Linear(3, 4), lk.ReLU(), lk.Linear(4, 2))
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    with torch.no_grad():
        for (_, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
            q.copy_(torch.from_numpy(p.data))
    return ours, theirs


def _log_calls(model, log, names):
    for name, m in model.named_modules():
        tag = name or "root"
        m.register_forward_pre_hook(lambda mod, args, tag=tag: log.append(("pre", tag)))
        m.register_forward_hook(lambda mod, args, out, tag=tag: log.append(("fwd", tag)))
        m.register_full_backward_hook(
            lambda mod, gi, go, tag=tag: log.append(("bwd", tag)))
        names.append(tag)


def test_forward_hooks_fire_in_torchs_order_for_call_and_vjp():
    ours, theirs = _pair()
    x = np.ones((5, 3), np.float32)
    log_ours, log_theirs = [], []
    _log_calls(ours, log_ours, [])
    _log_calls(theirs, log_theirs, [])
    ours(x)
    theirs(torch.from_numpy(x))
    assert log_ours == log_theirs
    log_ours.clear()
    ours.vjp(x)
    assert log_ours == log_theirs  # vjp fires exactly the same forward hooks


def test_backward_hooks_see_torchs_grad_output_and_grad_input():
    ours, theirs = _pair()
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    dy = np.random.default_rng(1).standard_normal((5, 2)).astype(np.float32)
    seen_ours, seen_theirs = {}, {}
    for (name, m), (_, t) in zip(ours.named_modules(), theirs.named_modules()):
        m.register_full_backward_hook(
            lambda mod, gi, go, name=name: seen_ours.update({name: (gi, go)}))
        t.register_full_backward_hook(
            lambda mod, gi, go, name=name: seen_theirs.update({name: (gi, go)}))
    _, back = ours.vjp(x)
    back(dy)
    xt = torch.from_numpy(x).requires_grad_()
    theirs(xt).backward(torch.from_numpy(dy))
    assert seen_ours.keys() == seen_theirs.keys()
    for name, (gi, go) in seen_ours.items():
        ti, to = seen_theirs[name]
        torch.testing.assert_close(torch.from_numpy(go[0]), to[0])
        torch.testing.assert_close(torch.from_numpy(gi[0]), ti[0])


def test_backward_hook_gets_none_for_input_grad_false_like_torch_for_a_leaf_without_grad():
    layer = lk.Linear(3, 2)
    seen = []
    layer.register_full_backward_hook(lambda m, gi, go: seen.append(gi))
    _, back = layer.vjp(np.ones((1, 3), np.float32), input_grad=False)
    back(np.ones((1, 2), np.float32))
    assert seen == [(None,)]


def test_pre_hook_can_replace_the_input_and_forward_hook_the_output():
    layer = lk.Linear(3, 2, bias=False)
    layer.weight.data[...] = 1
    layer.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    assert layer(np.ones((1, 3), np.float32)).tolist() == [[6.0, 6.0]]
    layer.register_forward_hook(lambda m, args, y: y + 1)
    assert layer(np.ones((1, 3), np.float32)).tolist() == [[7.0, 7.0]]
    with pytest.raises(TypeError, match="cannot differentiate through a hook"):
        layer.vjp(np.ones((1, 3), np.float32))


def test_backward_hooks_can_replace_gradients():
    layer = lk.Linear(3, 2)
    layer.register_full_backward_pre_hook(lambda m, go: (go[0] * 0,))
    _, back = layer.vjp(np.ones((1, 3), np.float32))
    dx = back(np.ones((1, 2), np.float32))
    assert not dx.any() and not layer.weight.grad.any()
    layer.register_full_backward_hook(lambda m, gi, go: (np.full_like(gi[0], 7),))
    _, back = layer.vjp(np.ones((1, 3), np.float32))
    assert (back(np.ones((1, 2), np.float32)) == 7).all()


def test_with_kwargs_sees_input_grad_however_it_was_passed():
    layer = lk.Linear(3, 2)
    seen = []
    layer.register_forward_pre_hook(lambda m, a, k: seen.append((len(a), k)), with_kwargs=True)
    x = np.ones((1, 3), np.float32)
    layer.vjp(x, False)
    layer.vjp(x, input_grad=False)
    layer.vjp(x)
    layer(x)
    assert seen == [(1, {"input_grad": False}), (1, {"input_grad": False}),
                    (1, {"input_grad": True}), (1, {})]


def test_handles_remove_hooks_and_observe_cleans_up_even_on_error():
    model = lk.Sequential(lk.Linear(3, 4), lk.ReLU())
    calls = []
    handle = model.register_forward_hook(lambda m, a, y: calls.append(1))
    model(np.ones((1, 3), np.float32))
    handle.remove()
    handle.remove()  # idempotent, as torch's
    model(np.ones((1, 3), np.float32))
    assert calls == [1]
    with pytest.raises(lk.ShapeError):
        with lk.hooks.observe(model, forward=lambda m, a, y: calls.append(2)):
            model(np.ones((1, 5), np.float32))
    assert not any(m.has_hooks() for m in model.modules())
    with lk.hooks.observe(forward=lambda m, a, y: calls.append(type(m).__name__)):
        lk.ReLU()(np.ones(2, np.float32))
    assert calls[-1] == "ReLU" and not lk.hooks.active


def test_a_super_vjp_fires_the_hooks_once():
    class Doubled(lk.Linear):
        def vjp(self, x, input_grad=True):
            y, back = super().vjp(x, input_grad)
            return y * 2, lambda dy: back(dy * 2)

    layer = Doubled(3, 2)
    calls = []
    layer.register_forward_hook(lambda m, a, y: calls.append(y.copy()))
    layer.register_full_backward_hook(lambda m, gi, go: calls.append(gi))
    y, back = layer.vjp(np.ones((1, 3), np.float32))
    back(np.ones((1, 2), np.float32))
    assert len(calls) == 2 and np.array_equal(calls[0], y)


def test_a_non_callable_hook_is_refused():
    with pytest.raises(TypeError, match="must be callable"):
        lk.Linear(2, 2).register_forward_hook(3)


def test_no_instance_method_is_reassigned_anywhere_in_the_package():
    root = pathlib.Path(lk.__file__).parent
    pattern = re.compile(r"""(object\.__setattr__\(\s*\w+\s*,\s*["'](vjp|forward|__call__)["']"""
                         r"""|\.(vjp|forward)\s*=(?!=))""")
    offenders = [f"{path.relative_to(root)}:{i}" for path in root.rglob("*.py")
                 for i, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line) and "cls.vjp" not in line]
    assert offenders == []
