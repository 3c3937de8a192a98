"""The rule registry: one ``LayerRule`` per layer type, found through the type's MRO.

A rule says what a tool needs to know about a layer without running it: its row kind, its
description, its output shape (running the layer's own shape check), its cost, what its backward
keeps, and what the findings read. Containers carry a ``compose`` callable instead, through which
a tool walks their children. Tools (the ledger, ONNX export, model files, the transforms, the
PyTorch interop, ``Module.load_state_dict``) read rules, never a layer's private attributes, and
grow no isinstance chain: the questions a class check used to answer ("may this transform edit
it?", "which keys are ``(out, in)`` kernels?", "which torch class is its twin?") are asked here.

This module imports nothing from ``linearkit.layers`` (nor ``linearkit.core``):
``linearkit.core.module`` asks it which state-dict keys ``layout='in_out'`` transposes.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .torch_twin import TorchTwin

__all__ = ["LayerRule", "RuleHandle", "is_lazy", "own_rule", "register_rule", "registered_types",
           "rule_for", "torch_twin_of", "torch_twins", "transforms_for", "transposable_keys"]

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
        The ``linearkit.transforms`` (and ``linearkit.distributed`` sharding functions) that may
        edit or rebuild this layer type: 'merge_linear', 'fold_norm', 'factorize', 'add_lora',
        'extract_lora', 'quantize', 'prune', 'to_sparse', 'fuse_qkv', 'split_qkv' and
        'shard_linear' list a dense Linear (``weight (out, in)``, ``bias (out,)``, rewritten or
        replaced by a new Linear); 'merge_linear' on an 'identity' or 'dropout' kind lists a
        pass-through layer a run of Linears may cross; 'merge_linear' and 'fold_norm' on a
        'sequential' kind list a chain whose steps (``named_steps()``) are edited and which is
        rebuilt as a ``linearkit.Sequential``; 'merge_lora' lists a LoRA adapter;
        'gather_linear' a tensor-parallel shard. A transform only touches a layer whose rule
        lists it (``transforms_for``), and checks no class (default: none).
    transforms_inherited : bool
        Whether a subclass that has no rule of its own may be transformed as this type (default
        False: a subclass may override ``forward`` and compute something else, so a subclass of
        ``Linear`` is left alone). True where the transforms read only what every subclass
        keeps: a pass-through layer (Identity, Dropout), a LoRA adapter, a parallel shard.
    lazy : bool or None
        True for a layer whose parameters do not exist yet: its first forward (or a state-dict
        load) creates them, with ``reset_parameters(rng)`` drawing their values (LazyLinear,
        which then becomes a Linear). Transforms leave it alone and say why; a transform's
        check seeds it alike on both sides of the comparison. None (the default): the value of
        the rule this one replaces, else False.
    transposable_keys : tuple of str, or None
        The layer's own parameter names stored ``(out_features, in_features)``, which
        ``Module.load_state_dict(..., layout='in_out')`` transposes from an ``(in, out)``
        checkpoint (``('weight',)`` for Linear and LazyLinear). None (the default): the value of
        the rule this one replaces, else none.
    torch : ``TorchTwin``, str, a tuple of them, or None
        The layer's PyTorch twin(s) (``linearkit.rules.TorchTwin``; a str is
        ``TorchTwin(path)``): the torch class ``io.to_torch`` builds and ``io.from_torch``
        accepts, with the constructor arguments, and the torch class the ledger's PyTorch path
        costs with this rule. Stored as a tuple of ``TorchTwin``. None (the default): the twins
        of the rule this one replaces, else none — a rule registered for a shipped layer to
        change its cost keeps the layer's twin (``torch_twins``).
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
    transforms_inherited: bool = False
    lazy: bool | None = None
    transposable_keys: tuple | None = None
    torch: Any = None

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
        if not isinstance(self.transforms_inherited, bool):
            raise TypeError("LayerRule.transforms_inherited must be a bool, got "
                            f"{self.transforms_inherited!r}")
        if self.lazy is not None and not isinstance(self.lazy, bool):
            raise TypeError(f"LayerRule.lazy must be a bool or None, got {self.lazy!r}")
        if self.transposable_keys is not None and not (
                isinstance(self.transposable_keys, tuple)
                and all(isinstance(k, str) for k in self.transposable_keys)):
            raise TypeError("LayerRule.transposable_keys must be a tuple of parameter names "
                            f"(('weight',)) or None, got {self.transposable_keys!r}")
        if self.torch is not None:  # stored as a tuple of TorchTwin (frozen: set it once here)
            twins = self.torch if isinstance(self.torch, (tuple, list)) else (self.torch,)
            twins = tuple(TorchTwin(t) if isinstance(t, str) else t for t in twins)
            bad = [t for t in twins if not isinstance(t, TorchTwin)]
            if bad:
                raise TypeError("LayerRule.torch takes TorchTwin(...) or a class path such as "
                                f"'torch.nn.Linear' (or a tuple of them), got "
                                f"{type(bad[0]).__name__} {bad[0]!r}")
            if sum(t.to_torch for t in twins) > 1:
                raise TypeError("LayerRule.torch: at most one twin may be what to_torch builds, "
                                f"got {[t.path for t in twins if t.to_torch]}; give the others "
                                "to_torch=False")
            object.__setattr__(self, "torch", twins)

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

    __slots__ = ("_previous", "_previous_facts", "_rule", "_type")

    def __init__(self, layer_type: type, rule: LayerRule, previous: LayerRule | None,
                 previous_facts: dict | None = None):
        self._type, self._rule, self._previous = layer_type, rule, previous
        self._previous_facts = previous_facts

    def remove(self) -> None:
        if _RULES.get(self._type) is not self._rule:
            return  # already removed, or replaced since: leave the newer rule alone
        if self._previous is None:
            del _RULES[self._type]
            _FACTS.pop(self._type, None)
        else:
            _RULES[self._type] = self._previous
            _FACTS[self._type] = self._previous_facts

    def __enter__(self) -> RuleHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


_RULES: dict[type, LayerRule] = {}

#: The fields a rule that leaves them None takes from the rule it replaces (what the layer *is*,
#: not how a tool counts it), with their value for a type registered for the first time.
_KEPT = {"lazy": False, "transposable_keys": (), "torch": ()}
#: Per registered type, those fields as they stand (the rule's own, else the replaced rule's).
_FACTS: dict[type, dict] = {}


def _is_module_class(cls: type) -> bool:
    # linearkit.core.module asks this registry (load_state_dict's layout), so the registry does
    # not import it back; a Module subclass exists only once that module is loaded.
    core = sys.modules.get("linearkit.core.module")
    return core is not None and issubclass(cls, core.Module)


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
    if not _is_module_class(layer_type):
        raise TypeError(f"register_rule() takes a linearkit Module subclass, got "
                        f"{layer_type.__name__}")
    if not isinstance(rule, LayerRule):
        raise TypeError(f"register_rule() takes a LayerRule, got {type(rule).__name__}; build "
                        "one with LayerRule(kind=..., cost=..., saved=...)")
    previous, previous_facts = _RULES.get(layer_type), _FACTS.get(layer_type)
    before = previous_facts or _KEPT
    _RULES[layer_type] = rule
    _FACTS[layer_type] = {name: before[name] if getattr(rule, name) is None
                          else getattr(rule, name) for name in _KEPT}
    return RuleHandle(layer_type, rule, previous, previous_facts)


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


def _type_of(module_or_type) -> type:
    return module_or_type if isinstance(module_or_type, type) else type(module_or_type)


def own_rule(module_or_type) -> LayerRule | None:
    """The rule registered for exactly this module's type (not one a base class gives it), or
    None. What ``to_torch`` converts by: a subclass may compute something else."""
    return _RULES.get(_type_of(module_or_type))


def _fact(module_or_type, name: str):
    """Field ``name`` of ``_KEPT`` for a module or type, through the MRO as ``rule_for``."""
    for base in _type_of(module_or_type).__mro__:
        facts = _FACTS.get(base)
        if facts is not None:
            return facts[name]
    return _KEPT[name]


def transforms_for(module_or_type) -> tuple:
    """The transforms that may edit this module: its rule's ``transforms`` when the rule is its
    own type's, or is a base's that says ``transforms_inherited``; else ``()``.

    >>> import linearkit as lk
    >>> from linearkit.rules import transforms_for
    >>> "factorize" in transforms_for(lk.Linear(2, 3))
    True
    >>> class Doubled(lk.Linear):  # may compute something else: no transform touches it
    ...     def forward(self, x):
    ...         return 2 * super().forward(x)
    >>> transforms_for(Doubled(2, 3))
    ()
    """
    cls = _type_of(module_or_type)
    for base in cls.__mro__:
        rule = _RULES.get(base)
        if rule is not None:
            return rule.transforms if base is cls or rule.transforms_inherited else ()
    return ()


def is_lazy(module_or_type) -> bool:
    """Whether the module's parameters do not exist yet (its rule's ``lazy``: an unmaterialized
    LazyLinear)."""
    return bool(_fact(module_or_type, "lazy"))


def transposable_keys(module_or_type) -> tuple:
    """The module's own parameter names stored ``(out_features, in_features)`` (its rule's
    ``transposable_keys``: ``('weight',)`` for a Linear), which ``load_state_dict(...,
    layout='in_out')`` transposes; ``()`` for a layer without one."""
    return _fact(module_or_type, "transposable_keys")


def torch_twins(layer_type: type) -> tuple:
    """The ``TorchTwin`` s of exactly ``layer_type`` (its own rule's ``torch``, or, where that
    rule names none, the rule's it replaced); ``()`` for a type without one."""
    facts = _FACTS.get(layer_type)
    return () if facts is None else facts["torch"]


def torch_twin_of(torch_module) -> tuple[type, TorchTwin] | None:
    """``(linearkit layer type, twin)`` by which the ledger's PyTorch path costs
    ``torch_module`` (with ``rule_for(layer type)``), or None.

    The nearest class in the torch module's MRO that is a twin's (resolved: call this with
    torch imported) and that the twin's ``ledger`` matches: exactly its class, or a subclass
    too. Where two rules name the same torch class, the one registered later wins.
    """
    by_class = {}
    for layer_type in registered_types():
        for twin in torch_twins(layer_type):
            if twin.ledger is not None:
                by_class[twin.resolve()] = (layer_type, twin)
    cls = type(torch_module)
    for base in cls.__mro__:
        hit = by_class.get(base)
        if hit is not None and (base is cls or hit[1].ledger == "subclasses"):
            return hit
    return None
