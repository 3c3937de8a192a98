"""What every transform test checks about its input model: nothing in it changed."""

import numpy as np


def snapshot(model):
    """A copy of what a transform must not touch: the state dict, each module's training mode
    and each parameter's requires_grad."""
    return ({k: np.array(v, copy=True) for k, v in model.state_dict().items()},
            [m.training for m in model.modules()],
            [p.requires_grad for p in model.parameters()])


def assert_unchanged(model, before):
    """``model`` still is what ``snapshot`` saw: same keys, bitwise-equal values, same modes."""
    state, modes, flags = before
    now = model.state_dict()
    assert list(now) == list(state)
    assert all(np.array_equal(now[k], v) for k, v in state.items())
    assert [m.training for m in model.modules()] == modes
    assert [p.requires_grad for p in model.parameters()] == flags
