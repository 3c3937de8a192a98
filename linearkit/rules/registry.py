"""The rule registry: one ``LayerRule`` per layer type, found through the type's MRO.

A rule says what a tool needs to know about a layer without running it: its row kind, its
description, its output shape (running the layer's own shape check), its cost, what its backward
keeps, and what the findings read. Containers carry a ``compose`` callable instead, through which
a tool walks their children. Tools (the ledger now; ONNX export, model files and transforms
later) read rules, never a layer's private attributes, and grow no isinstance chain.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["LayerRule", "RuleHandle", "register_rule", "registered_types", "rule_for"]

Shape = tuple
#: ``(macs, gemm_flops, bias_flops, elementwise_flops, backward_macs, backward_flops)``.
Cost = tuple


@dataclass(frozen=True)
class LayerRule:
    """What tools need to know about one layer type. Every callable takes the module first.

    Attributes
    ----------
    kind : str
        The ledger row's kind: 'linear', 'activation', 'dropout', 'flatten', 'identity',
        'layernorm', 'batchnorm', 'sequential', 'residual', or your own (default 'layer').
        The findings look for 'linear', 'batchnorm' and the pass-through kinds 'identity',
        'dropout' and 'flatten'; 'sequential' children form a chain the findings scan; a
        'checkpoint' container's children are recomputed in its backward, so the ledger counts
        their saved arrays as a recompute peak, not as held (``rules/checkpoint_rules.py``).
    describe : ``describe(m) -> str``, optional
        The compact type text: 'Linear(784, 256)'. Default: the class name.
    output_shape : ``output_shape(m, in_shape) -> out_shape``, optional
        The shape-only forward: runs the layer's own shape check, so a bad shape raises the
        ShapeError the real forward would, and returns the output's shape. Default: the input's
        shape, no check.
    shares_input : bool or ``shares_input(m) -> bool``
        True when the output is a view of the input's buffer (Flatten, Identity, eval Dropout),
        so an array kept by a later layer is the same one (default False).
    cost : ``cost(m, in_shape, need_dx) -> (macs, gemm_flops, bias_flops, elementwise_flops,
        backward_macs, backward_flops)``, optional
        Multiply-adds and FLOPs of one call on an input of ``in_shape`` (see
        ``linearkit.rules.cost_rules`` for the conventions and the helpers). ``need_dx``: something
        before the layer needs the input gradient, so the backward computes dX. None: unknown
        (the ledger says the FLOPs are missing).
    saved : ``saved(m, in_shape, need_dx) -> [(what, numel[, dtype]), ...]``, optional
        The arrays the backward closure keeps: ``what`` is 'input', 'output' (the same array as
        the layer's input or output, counted once over the model) or a name of the layer's own
        ('mask', 'xhat', ...); ``numel`` its number of elements; ``dtype`` what it is kept in:
        omitted, that array's dtype ('input', 'output') or the layer's compute dtype (its own);
        a NumPy dtype; or ``'activation'``, kept through ``precision.saved_activation`` — a
        rounded copy in the policy's ``activations`` dtype when that is set, else the array
        itself. ``[]``: keeps nothing. None: unknown (the ledger notes that the activations are
        missing).
    info : ``info(m, in_shape or None) -> dict``, optional
        What the findings read from the row: a Linear's sizes ``{'in', 'out', 'bias', 'lazy'}``,
        a BatchNorm1d's channels ``{'c'}``. ``in_shape`` is None without an input shape.
    weight : ``weight(m) -> ndarray (out, in) or None``, optional
        The 2-D weight the low-rank and alignment findings inspect.
    note : ``note(m, in_shape or None) -> str``, optional
        A remark for the row ('eval: running statistics').
    compose : ``compose(m, x, need_dx, visit) -> out``, optional — containers only
        Walks the children as the container's forward does: ``visit(child, name, x, need_dx)``
        returns the child's output value (an opaque value with ``.shape``; None when the tool has
        no input shape). ``compose`` returns a value ``visit`` gave (the output *is* that array),
        a shape tuple (a new array of that shape), or None when ``x`` is None. A container's
        ``cost`` and ``saved`` are its own share only (Residual's add); the children's are summed.

    onnx : optional
        How the layer exports to ONNX (``linearkit.rules.onnx_rules``; read by
        ``io.export_onnx``). None: the exporter refuses the type, naming its path.
    rebuild : ``linearkit.rules.Rebuild``, optional
        How a model file rebuilds the layer (its constructor arguments; read by ``io.spec``).
        None: ``linearkit.save`` keeps the weights but not the architecture.
    transforms : tuple of str
        The ``linearkit.transforms`` that edit this layer type ('merge_linear', 'fold_norm',
        'factorize', 'add_lora', 'quantize', 'prune', 'to_sparse'); a transform only touches a
        layer whose rule lists it (default: none).
    """

    kind: str = "layer"
    describe: Callable[[Any], str] | None = None
    output_shape: Callable[[Any, Shape], Shape] | None = None
    shares_input: bool | Callable[[Any], bool] = False
    cost: Callable[[Any, Shape, bool], Cost] | None = None
    saved: Callable[[Any, Shape, bool], list] | None = None
    info: Callable[[Any, Shape | None], dict] | None = None
    weight: Callable[[Any], Any] | None = None
    note: Callable[[Any, Shape | None], str] | None = None
    compose: Callable[[Any, Any, bool, Callable], Any] | None = None
    onnx: Any = None
    rebuild: Any = None
    transforms: tuple = ()

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or not self.kind:
            raise TypeError(f"LayerRule.kind must be a non-empty str, got {self.kind!r}")
        for name in ("describe", "output_shape", "cost", "saved", "info", "weight", "note",
                     "compose"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise TypeError(f"LayerRule.{name} must be callable or None, got "
                                f"{type(value).__name__}")
        if not (isinstance(self.transforms, tuple)
                and all(isinstance(t, str) for t in self.transforms)):
            raise TypeError("LayerRule.transforms must be a tuple of transform names, got "
                            f"{self.transforms!r}")
        if not (isinstance(self.shares_input, bool) or callable(self.shares_input)):
            raise TypeError("LayerRule.shares_input must be a bool or callable(m) -> bool, got "
                            f"{type(self.shares_input).__name__}")

    # What a tool calls; each applies the documented default.
    def describe_module(self, m) -> str:
        """``describe(m)``, or the class name."""
        return self.describe(m) if self.describe is not None else type(m).__name__

    def shape_of_output(self, m, in_shape: Shape) -> Shape:
        """``output_shape(m, in_shape)`` as a tuple, or ``in_shape``."""
        if self.output_shape is None:
            return tuple(in_shape)
        return tuple(self.output_shape(m, tuple(in_shape)))

    def output_shares_input(self, m) -> bool:
        """Whether this call's output is a view of its input's buffer."""
        return bool(self.shares_input(m) if callable(self.shares_input) else self.shares_input)


class RuleHandle:
    """Returned by ``register_rule``: ``remove()`` puts back the rule that was there before
    (none, or the built-in one it overrode). Also a context manager."""

    __slots__ = ("_previous", "_rule", "_type")

    def __init__(self, layer_type: type, rule: LayerRule, previous: LayerRule | None):
        self._type, self._rule, self._previous = layer_type, rule, previous

    def remove(self) -> None:
        if _RULES.get(self._type) is not self._rule:
            return  # already removed, or replaced since: leave the newer rule alone
        if self._previous is None:
            del _RULES[self._type]
        else:
            _RULES[self._type] = self._previous

    def __enter__(self) -> RuleHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


_RULES: dict[type, LayerRule] = {}


def register_rule(layer_type: type, rule: LayerRule) -> RuleHandle:
    """Make ``rule`` the rule of ``layer_type`` and of its subclasses that have none of their own.

    A rule registered for a type replaces the one it had (a user's rule for a shipped layer
    wins); ``handle.remove()`` restores it.

    Examples
    --------
    >>> import linearkit as lk
    >>> from linearkit.rules import LayerRule, register_rule, rule_for
    >>> class Twice(lk.Module):
    ...     def forward(self, x):
    ...         return 2 * x
    >>> with register_rule(Twice, LayerRule(kind="scale", cost=lambda m, s, need: (0,) * 6)):
    ...     rule_for(Twice()).kind
    'scale'
    >>> rule_for(Twice()) is None
    True
    """
    if not isinstance(layer_type, type):
        raise TypeError(f"register_rule() takes a layer class, got {type(layer_type).__name__} "
                        f"{layer_type!r}; pass type(module) for an instance")
    from ..core.module import Module

    if not issubclass(layer_type, Module):
        raise TypeError(f"register_rule() takes a linearkit Module subclass, got "
                        f"{layer_type.__name__}")
    if not isinstance(rule, LayerRule):
        raise TypeError(f"register_rule() takes a LayerRule, got {type(rule).__name__}; build "
                        "one with LayerRule(kind=..., cost=..., saved=...)")
    previous = _RULES.get(layer_type)
    _RULES[layer_type] = rule
    return RuleHandle(layer_type, rule, previous)


def rule_for(module_or_type) -> LayerRule | None:
    """The rule of a module (or layer class): its own type's, else the nearest base's in the MRO;
    None when no class in the MRO has one (tools then fall back to running it)."""
    cls = module_or_type if isinstance(module_or_type, type) else type(module_or_type)
    for base in cls.__mro__:
        rule = _RULES.get(base)
        if rule is not None:
            return rule
    return None


def registered_types() -> list[type]:
    """Every layer type that has a rule of its own, in registration order."""
    return list(_RULES)
