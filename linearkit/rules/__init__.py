"""Per-layer rules: what tools need to know about each layer type, in one registry.

``rule_for(module)`` gives a module's ``LayerRule`` — its row kind, description, shape-only
forward, cost (MACs, forward/backward FLOPs), what its backward keeps, and what the findings read;
containers carry ``compose``, which walks their children. The ledger reads rules instead of
isinstance chains and private attributes; ONNX export, model files and transforms will add their
fields to the same rules. A new layer, the library's or a user's, adds one entry:

>>> import math, numpy as np, linearkit as lk
>>> from linearkit.rules import LayerRule, register_rule
>>> class Scale(lk.Module):  # y = x * weight (docs/custom_modules.md has its vjp)
...     def __init__(self, d):
...         super().__init__()
...         self.weight = lk.Parameter(np.ones(d, np.float32))
...     def forward(self, x):
...         return x * self.weight.data
>>> handle = register_rule(Scale, LayerRule(
...     kind="scale",
...     cost=lambda m, shape, need_dx: (0, 0, 0, math.prod(shape), 0, math.prod(shape)),
...     saved=lambda m, shape, need_dx: [("input", math.prod(shape))]))
>>> lk.analysis.ledger(Scale(4), (8, 4))[""].flops
32
>>> handle.remove()

Rules are looked up through the MRO: a subclass inherits its base's rule unless it has its own,
and a rule registered for a type replaces the one it had. The transforms a rule lists apply to
exactly its type unless it says ``transforms_inherited`` (``transforms_for``); a layer's PyTorch
twin (``TorchTwin``, ``torch=``: what ``io.from_torch``/``to_torch`` convert and the ledger's
PyTorch path costs) and its ``lazy`` / ``transposable_keys`` facts stay with the type when a
rule that leaves them None replaces its rule. The built-in rules are in
``linearkit/rules/builtin.py`` (their twins in ``torch_rules.py``); the counting conventions in
``linearkit/rules/cost_rules.py``.
"""

from . import cost_rules as costs  # the public name: linearkit.rules.costs
from .builtin import register_builtin_rules
from .input_width import first_input
from .rebuild import Rebuild
from .registry import (
    LayerRule,
    RuleHandle,
    is_lazy,
    own_rule,
    register_rule,
    registered_types,
    rule_for,
    torch_twin_of,
    torch_twins,
    transforms_for,
    transposable_keys,
)
from .surgery_rules import register_surgery_rules
from .torch_twin import TorchTwin

register_builtin_rules()
register_surgery_rules()

__all__ = ["LayerRule", "Rebuild", "RuleHandle", "TorchTwin", "costs", "first_input", "is_lazy",
           "own_rule", "register_rule", "registered_types", "rule_for", "torch_twin_of",
           "torch_twins", "transforms_for", "transposable_keys"]
