"""Activation checkpointing: keep a segment's input, recompute its activations in the backward.

``checkpoint(module)`` wraps a module so that ``vjp`` runs a plain forward (no backward closures,
so none of the segment's activations stay alive) and keeps only the input ``x`` and the states of
the random generators the segment draws from. Its ``backward(dy)`` runs ``module.vjp(x)`` again —
the recompute — with the generators put back where they were, so Dropout draws the same masks,
and with BatchNorm's running statistics frozen, so they are updated once per step, then calls the
recomputed closure. The gradients are the plain module's, bit for bit; the price is one more
forward of the segment per step. ``checkpoint_sequential(seq, segments)`` wraps runs of a
Sequential, as ``torch.utils.checkpoint.checkpoint_sequential`` does.

Conventions (compared with PyTorch's ``torch.utils.checkpoint``):

* **State-dict keys get a ``module.`` prefix.** torch wraps a *call*, so its keys do not change;
  here the wrapper is a Module holding the segment as its child ``module`` (as ``Residual``
  does), because the tools walk the tree: the ledger, model files, ONNX export and hooks all see
  the wrapped layers at ``<path>.module.<...>``. Rewriting only the state-dict keys would make
  them disagree with ``named_parameters`` and with the paths errors name. To load weights saved
  without checkpointing, load them into the plain model and wrap it afterwards:
  ``checkpoint_sequential`` returns a new Sequential that *shares* the plain model's layers.
* **Random numbers**: the recompute replays the states, at the forward, of the library's
  generator (``linearkit.manual_seed``) and of every ``numpy.random.Generator`` a module of the
  segment holds as an attribute (``Dropout(rng=...)``). Each generator is put back afterwards
  where it was, so the streams advance exactly as in a step without checkpointing: training with
  checkpointing is bitwise identical to training without (for a deterministic BLAS).
* **BatchNorm**: the recompute uses the batch statistics, like the forward, but neither updates
  the running statistics nor counts ``num_batches_tracked`` a second time (torch's recompute
  does: its ``num_batches_tracked`` counts 2 per checkpointed step, and the momentum is applied
  twice).
* **Hooks**: as in torch, the forward hooks of the wrapped modules fire twice per step — in the
  forward (a plain call: no ``input_grad`` in the hook's kwargs) and in the recompute inside the
  backward (a ``vjp`` call: kwargs hold ``input_grad``; ``recomputing()`` is True then). Their
  backward hooks fire once. The wrapper's own hooks fire once each. ``analysis.stats`` watches
  ``vjp`` calls only, so it records each layer once: in the recompute.
* **Memory**: what stays alive from the forward to the backward is ``x`` (torch keeps the input
  too); during the segment's backward its activations exist once more, for that segment only.
  The ledger counts it that way (``linearkit.rules.checkpoint_rules``). The input must not be
  changed in place between the forward and the backward (it is not copied).
"""

from __future__ import annotations

import contextlib
import math
import numbers
from collections import OrderedDict

import numpy as np

from ..core import random as _random
from ..core.module import Module
from ..layers.container import Sequential, trains
from ..layers.norm import running_stats_frozen

__all__ = ["Checkpoint", "checkpoint", "checkpoint_sequential", "recomputing"]

_depth = 0  # > 0 while a checkpoint recomputes its segment's forward


def recomputing() -> bool:
    """True while a checkpoint recomputes its segment (inside its backward).

    A forward hook that should see each call once can return early when this is True.

    >>> recomputing()
    False
    """
    return _depth > 0


@contextlib.contextmanager
def _recompute():
    global _depth
    _depth += 1
    try:
        with running_stats_frozen():
            yield
    finally:
        _depth -= 1


class _Generators:
    """The states, now, of the generators a segment can draw from; ``replayed()`` puts them back
    for the duration of a ``with`` block and then restores the states they had on entry."""

    def __init__(self, module: Module):
        own = {}
        for m in module.modules():
            for value in vars(m).values():
                if isinstance(value, np.random.Generator):
                    own[id(value)] = value
        self.own = [(g, g.bit_generator.state) for g in own.values()]
        # The library's generator is found again when replaying: manual_seed() may have
        # replaced the object between the forward and the backward.
        self.library = _random.default_generator().bit_generator.state

    @contextlib.contextmanager
    def replayed(self):
        library = _random.default_generator()
        targets = [(library, self.library)]
        targets += [(g, state) for g, state in self.own if g is not library]
        now = [(g, g.bit_generator.state) for g, _ in targets]
        for g, state in targets:
            g.bit_generator.state = state
        try:
            yield
        finally:
            for g, state in now:
                g.bit_generator.state = state


class Checkpoint(Module):
    """Run ``module`` with activation checkpointing: its backward recomputes its forward.

    Parameters
    ----------
    module : Module
        The segment. Held as the child ``module`` (state-dict keys ``module.<...>``).

    Shape
    -----
    Whatever ``module`` maps: x -> y, as ``module(x)``.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.training.checkpointing import checkpoint
    >>> block = lk.Sequential(lk.Linear(4, 8), lk.ReLU(), lk.Dropout(0.5), lk.Linear(8, 4))
    >>> x = np.ones((2, 4), np.float32)
    >>> _ = lk.manual_seed(1)  # the Dropout mask comes from the library's generator
    >>> y, backward = block.vjp(x)
    >>> dx = backward(np.ones_like(y))
    >>> plain = [p.grad.copy() for p in block.parameters()]
    >>> block.zero_grad()
    >>> _ = lk.manual_seed(1)
    >>> y2, backward = checkpoint(block).vjp(x)
    >>> dx2 = backward(np.ones_like(y2))
    >>> np.array_equal(y, y2), np.array_equal(dx, dx2)
    (True, True)
    >>> all(np.array_equal(g, p.grad) for g, p in zip(plain, block.parameters()))
    True
    """

    def __init__(self, module: Module):
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"checkpoint() wraps a linearkit Module, got {type(module).__name__}"
                            "; wrap the layer or Sequential whose activations to recompute")
        self.module = module

    def forward(self, x):
        """``module(x)``: a forward keeps nothing anyway."""
        return self.module(x)

    def vjp(self, x, input_grad: bool = True):
        """A plain forward now, ``module.vjp(x)`` again inside ``backward``.

        Parameters
        ----------
        x : ndarray, the segment's input (kept, not copied, until ``backward`` runs)
        input_grad : bool
            False when the caller needs no ``dx``: passed to the recompute; ``backward`` then
            returns None. A segment with nothing to train under ``input_grad=False`` keeps
            nothing and its backward recomputes nothing.

        Returns
        -------
        y : ndarray
            ``module(x)``: the array ``module.vjp(x)`` would return.
        backward : callable
            ``backward(dy) -> dx``: recomputes ``module.vjp(x, input_grad)`` with the forward's
            random states and frozen BatchNorm statistics, then runs its closure, which adds
            the parameters' gradients into ``.grad`` exactly as without checkpointing.
        """
        module = self.module
        if not input_grad and not trains(module):
            return module(x), (lambda dy: None)
        generators = _Generators(module)
        y = module(x)

        def backward(dy):
            with generators.replayed(), _recompute():
                recomputed = module.vjp(x, input_grad=input_grad)[1]  # its y is dropped now
            return recomputed(dy)

        return y, backward


def checkpoint(module: Module) -> Checkpoint:
    """``module`` wrapped in a ``Checkpoint``: its ``vjp`` keeps only its input and recomputes
    the forward in the backward (see the module docstring). The module itself is not copied."""
    return Checkpoint(module)


def checkpoint_sequential(seq: Sequential, segments: int) -> Sequential:
    """A new Sequential running ``seq``'s layers in ``segments`` runs, all but the last
    checkpointed — the split ``torch.utils.checkpoint.checkpoint_sequential`` makes.

    Each of the first ``segments - 1`` runs holds ``len(seq) // segments`` consecutive layers; the
    last run holds the rest and is not checkpointed: its activations are needed first in the
    backward, so recomputing them would cost time and save nothing. Every run is a Sequential
    keeping the layers' names in ``seq``. The layers are shared, not copied: ``seq`` is left as
    it was (and trains along).

    Parameters
    ----------
    seq : Sequential
    segments : int, 1 <= segments <= len(seq)

    Returns
    -------
    Sequential
        ``segments`` children ``'0'``, ``'1'``, ...: ``Checkpoint(Sequential(run))`` for each
        checkpointed run, then ``Sequential(last run)``. The same function as ``seq``; a layer's
        state-dict key ``<name>.<param>`` becomes ``<run>.module.<name>.<param>``
        (``<run>.<name>.<param>`` in the last run).

    Examples
    --------
    >>> import linearkit as lk
    >>> seq = lk.Sequential(*[lk.Linear(3, 3) for _ in range(5)])
    >>> model = checkpoint_sequential(seq, 2)
    >>> [type(m).__name__ for m in model]
    ['Checkpoint', 'Sequential']
    >>> list(model.state_dict())[::2]
    ['0.module.0.weight', '0.module.1.weight', '1.2.weight', '1.3.weight', '1.4.weight']
    """
    if not callable(getattr(seq, "named_steps", None)):     # a Sequential (or one of its kind)
        raise TypeError(f"checkpoint_sequential() takes a Sequential, got {type(seq).__name__}; "
                        "wrap a single module with checkpoint(module)")
    steps = list(seq.named_steps())
    if not isinstance(segments, numbers.Integral) or isinstance(segments, bool) \
            or not 1 <= segments <= len(steps):
        raise ValueError(f"checkpoint_sequential: segments must be an int from 1 to len(seq) = "
                         f"{len(steps)}, got {segments!r} (sqrt(len(seq)) segments balance "
                         f"memory and time: {max(1, round(math.sqrt(len(steps))))} here)")
    size = len(steps) // segments
    runs = [Sequential(OrderedDict(steps[s * size:(s + 1) * size])) for s in range(segments - 1)]
    runs = [Checkpoint(run) for run in runs]
    runs.append(Sequential(OrderedDict(steps[(segments - 1) * size:])))
    out = Sequential(*runs)
    for m in [out, *runs, *(r.module for r in runs[:-1])]:
        m.training = seq.training  # the new containers only: the shared layers keep theirs
    return out
