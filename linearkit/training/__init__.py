"""Training: the step (``loop``), the MNIST-1D recipe behind ``linearkit train`` (``recipe``),
gradient accumulation, automatic mixed precision (``amp``) and activation checkpointing."""
