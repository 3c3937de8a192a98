"""The ledger: what goes in and out of each layer, what it costs, and what is redundant.

``ledger(model, input_shape)`` answers, for a linearkit model, a PyTorch ``nn.Module`` or a
``.safetensors`` file, in one report whose every number can be checked by hand:

* one row per module: path, type, input and output shape, parameters (all / trainable), MACs,
  forward and backward FLOPs, output bytes, and the bytes its backward keeps alive;
* totals and a memory budget for one training step: weights, buffers, gradients, optimizer
  states, a float32 master copy under mixed precision, saved activations — each in the dtype
  linearkit keeps it in under the precision policy in force (``linearkit.precision``);
* findings: redundant linear structure, each with the fix and what it saves.

Counting conventions (printed with every table, see ``CONVENTIONS``):

* **MACs** are the multiply-adds of the matmuls: ``B·in·out`` for a ``Linear(in, out)``, where
  ``B`` is the product of the input's leading dimensions.
* **FLOPs** = 2 per multiply-add, plus one add per output element for each bias
  (``Linear``: ``2·B·in·out + B·out``), plus a nominal per-element cost for nonlinearities and
  normalizations (``ELEMENTWISE_FLOPS``).
* **Backward FLOPs**: the dX GEMM (``2·B·in·out``) only when something before the layer needs a
  gradient (not for the first layer or a frozen prefix — the rule of ``Sequential.vjp``), the dW
  GEMM (``2·B·in·out``) only for a trainable weight, ``B·out`` for a trainable bias, and the
  nominal elementwise backward costs.
* **Saved bytes** are what the backward closures really hold (a Linear its input, ReLU its
  output, Dropout its mask, a norm its normalized input and statistics); an array held by two
  closures (a ReLU's output is the next Linear's input) is counted once, at the first.

What the ledger knows about each layer comes from its rule (``linearkit.rules``): a new layer,
or a user's, adds one ``register_rule`` entry and gets a full row.

The package, one job a file: ``api`` (``ledger()``: arguments and the model's path),
``linearkit_model`` / ``linearkit_layers`` / ``custom`` (the linearkit shape pass, a rule put on a
row, and the run-once fallback for module types without a rule, observed through call hooks),
``torch_model`` (the PyTorch path, costed by the linearkit twins' rules), ``safetensors_file``
(the weights-file path), ``costs`` (the counting conventions),
``accumulator`` (rows and once-only counting), ``budget`` (totals and memory), ``findings``,
``report`` (``Ledger`` and its text, Markdown and dict forms) and ``presets``.
"""

from .api import ledger
from .budget import OPTIMIZER_STATES
from .costs import CONVENTIONS, ELEMENTWISE_FLOPS
from .presets import PRESETS, preset
from .report import Finding, Ledger, Row, human_bytes

__all__ = [
    "CONVENTIONS",
    "ELEMENTWISE_FLOPS",
    "OPTIMIZER_STATES",
    "PRESETS",
    "Finding",
    "Ledger",
    "Row",
    "human_bytes",
    "ledger",
    "preset",
]
