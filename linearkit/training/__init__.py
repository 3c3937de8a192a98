"""Training: the step (``loop``), gradient accumulation, automatic mixed precision (``amp``) and
activation checkpointing. The MNIST-1D recipe that composes them is ``linearkit.recipes``."""
