"""LoRALinear: a frozen Linear plus a trainable low-rank update (Hu et al. 2021), as peft's."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import init
from ..core.module import Module
from ._checks import as_input
from .container import trains
from .dropout import Dropout
from .linear import Identity, Linear, uninitialized

__all__ = ["LoRALinear"]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"LoRA {name} must be a positive int, got {value!r}")
    if value < 1:
        raise ValueError(f"LoRA {name} must be a positive int, got {value}")
    return int(value)


class LoRALinear(Module):
    """``y = base_layer(x) + scaling * lora_B(lora_A(lora_dropout(x)))``, ``scaling = alpha/rank``.

    That is ``x Wᵀ + b + (alpha/r) · dropout(x) Aᵀ Bᵀ``. The submodules carry peft's names
    (``base_layer``, ``lora_A``, ``lora_B``, ``lora_dropout``), so the state-dict keys read like
    a peft model's without its ``base_model.model.`` prefix and ``.default`` adapter name:
    ``base_layer.weight``, ``base_layer.bias``, ``lora_A.weight``, ``lora_B.weight``.

    Parameters
    ----------
    base : Linear
        The layer to adapt. It is held (not copied) and frozen in place: ``requires_grad`` False
        on its weight and bias. ``linearkit.transforms.add_lora`` passes a copy.
    rank : int
        ``r`` >= 1, the rank of the update (default 8).
    alpha : float
        The update's scale numerator, ``scaling = alpha / rank`` (default 16, so scaling 2).
    dropout : float
        Dropout on the adapter's input only: a ``Dropout(p)``, or ``Identity`` at ``p == 0``
        (as peft). The base path never drops.
    rng : numpy.random.Generator or int, optional
        Source of ``lora_A``'s values; defaults to the library's (``linearkit.manual_seed``).

    Shape
    -----
    x ``(*, in_features)`` -> y ``(*, out_features)``.

    Attributes
    ----------
    base_layer : Linear ``(in_features -> out_features)``, frozen
    lora_A : Linear(in_features, rank, bias=False), weight ``(rank, in_features)`` initialized
        as peft's ``kaiming_uniform_(a=sqrt(5))``: U(-k, k), k = 1/sqrt(in_features)
    lora_B : Linear(rank, out_features, bias=False), weight ``(out_features, rank)`` zeros, so a
        new adapter leaves the output unchanged
    lora_dropout : Dropout or Identity
    rank, alpha, scaling, in_features, out_features

    Notes
    -----
    ``vjp`` composes the children's closures: the frozen base keeps no activation and costs no
    dW GEMM (only its dX, when the caller needs one); ``lora_A`` keeps its input. The update is
    added after ``lora_B`` (``B(A(x)) * scaling``), in peft's order of operations.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.layers.lora import LoRALinear
    >>> layer = LoRALinear(lk.Linear(6, 4), rank=2, alpha=4, rng=0)
    >>> layer.lora_A.weight.shape, layer.lora_B.weight.shape, layer.scaling
    ((2, 6), (4, 2), 2.0)
    >>> [name for name, p in layer.named_parameters() if p.requires_grad]
    ['lora_A.weight', 'lora_B.weight']
    >>> x = np.ones((3, 6), np.float32)
    >>> bool((layer(x) == layer.base_layer(x)).all())  # B = 0: the base's output exactly
    True
    """

    def __init__(self, base: Linear, rank: int = 8, alpha: float = 16, dropout: float = 0.0, *,
                 rng: np.random.Generator | None = None):
        super().__init__()
        if type(base) is not Linear:
            raise TypeError(f"LoRALinear adapts a plain linearkit Linear, got "
                            f"{type(base).__name__}" + (
                                "; run it once (or load its weights) to materialize it first"
                                if type(base).__name__ == "LazyLinear" else ""))
        self.rank = _positive_int("rank", rank)
        if isinstance(alpha, bool) or not isinstance(alpha, numbers.Real) \
                or not math.isfinite(alpha) or alpha <= 0:
            raise ValueError(f"LoRA alpha must be a positive number, got {alpha!r}")
        self.alpha = alpha
        self.scaling = float(alpha) / self.rank
        self.in_features, self.out_features = base.in_features, base.out_features
        base.requires_grad_(False)
        self.base_layer = base
        p = float(dropout)
        self.lora_dropout = Dropout(p) if p > 0 else Identity()
        # Built without Linear's init, then initialized as peft does (the library's stream
        # advances only by A's draw).
        with uninitialized():
            self.lora_A = Linear(self.in_features, self.rank, bias=False, dtype=base.dtype)
            self.lora_B = Linear(self.rank, self.out_features, bias=False, dtype=base.dtype)
        self.reset_lora_parameters(rng)

    def reset_lora_parameters(self, rng: np.random.Generator | None = None) -> None:
        """peft's ``init_lora_weights=True``: ``kaiming_uniform_(A, a=sqrt(5))``, ``B = 0``."""
        init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5), rng=rng)
        init.zeros_(self.lora_B.weight)

    @property
    def dropout(self) -> float:
        """The adapter's dropout probability (0 for an Identity)."""
        return float(getattr(self.lora_dropout, "p", 0.0))

    def delta_weight(self) -> np.ndarray:
        """``scaling * B @ A``, shape ``(out_features, in_features)``, in float64."""
        a = np.asarray(self.lora_A.weight.data, np.float64)
        b = np.asarray(self.lora_B.weight.data, np.float64)
        return self.scaling * (b @ a)

    def forward(self, x):
        """``(*, in_features) -> (*, out_features)``."""
        x = as_input(self, x, self.base_layer.weight.data.dtype)
        y = self.base_layer(x)
        # Out of place: a hook on base_layer or lora_B may hold on to their outputs.
        return y + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    def vjp(self, x, input_grad: bool = True):
        """Forward plus a closure ``backward(dy (*, out)) -> dx (*, in)`` (None if not
        ``input_grad``).

        The closure adds ``dA``, ``dB`` (and, for a base someone unfroze, ``dW``, ``db``) into
        ``.grad``; ``dx = dy W + scaling · dropout'(dy B A)`` is formed only for ``input_grad``.
        """
        x = as_input(self, x, self.base_layer.weight.data.dtype)
        y, back_base = self.base_layer.vjp(x, input_grad=input_grad)
        d, back_drop = self.lora_dropout.vjp(x, input_grad=input_grad)
        a, back_a = self.lora_A.vjp(d, input_grad=input_grad)
        need_da = input_grad or trains(self.lora_A)
        b, back_b = self.lora_B.vjp(a, input_grad=need_da)
        s = self.scaling
        lora_trains = need_da or trains(self.lora_B)

        def backward(dy):
            dx = back_base(dy)
            if lora_trains:
                da = back_b(dy * s)
                if da is not None:
                    dd = back_a(da)
                    if dd is not None:
                        dd = back_drop(dd)
                        dx = dd if dx is None else dx + dd
            return dx if input_grad else None

        return y + b * s, backward

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}, scaling={self.scaling:g}"
