"""The one place that decides how a model runs: the thin path through a ``Sequential``, the
compiled chain, the compiled training step, and the reasons behind each choice."""
