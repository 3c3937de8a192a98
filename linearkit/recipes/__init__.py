"""Complete training runs built from the rooms below: ``mnist1d`` is the MNIST-1D recipe behind
``linearkit train`` (its model, data, optimizer, evaluation, precision and data-parallel
options). It sits above ``training`` and ``distributed``, which it composes."""
