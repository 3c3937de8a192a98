"""The message classes about layers' shapes: a Linear's width (``mat1 and mat2``, NumPy's
``not aligned``), a missing Flatten, a transposed weight, conv and pooling ranks and channels,
LayerNorm and BatchNorm widths, ``view``/``reshape``, broadcasting and gradient shapes.

Each handler takes the regex match and the ``Context`` and returns an ``Explanation``; the
numbers come from the message, the layer from the model when one was given.
"""

from __future__ import annotations

import math
import re

from .context import Context, ints
from .explanation import where
from .model_view import is_torch_module, weight_shape

__all__ = ["CLASSES", "batchnorm_mismatch", "layernorm_mismatch", "linear_mismatch"]


def _is_linear(m) -> bool:
    return hasattr(m, "in_features") and hasattr(m, "out_features") and \
        weight_shape(m) is not None


def _type(module, default: str) -> str:
    return default if module is None else type(module).__name__


def _shape(t) -> str:
    return "(" + ", ".join(str(d) for d in t) + ("," if len(t) == 1 else "") + ")"


def linear_mismatch(ctx: Context, k: int, in_: int, out: int, incoming=None):
    """A Linear of ``in_`` inputs and ``out`` outputs (as its weight says: ``(out, in_)``)
    received ``k`` features (``incoming``: the input's whole shape, when known)."""
    path, module, seen = ctx.locate(_is_linear, lambda m: weight_shape(m) == (out, in_),
                                    f"Linear layers with a ({out}, {in_}) weight")
    incoming = incoming or seen
    name = _type(module, "Linear")
    declared = None if module is None else (module.in_features, module.out_features)
    w = None if module is None else weight_shape(module)
    at = where(path)
    if declared is not None and w == declared and declared[0] != declared[1]:
        cause = (f"{at} is {name}({declared[0]}, {declared[1]}) but its weight has shape "
                 f"{_shape(w)}, which is (in_features, out_features): a Linear stores "
                 f"(out_features, in_features), so the weight was assigned transposed")
        fix = (f"is the weight transposed? store it as weight = W.T, shape "
               f"{_shape(declared[::-1])}" + ("" if is_torch_module(module) else
                                              ' (or load (in, out) kernels with '
                                              'load_state_dict(sd, layout="in_out"))'))
        return ctx.explanation("transposed_weight", cause, fix, path)
    if incoming is not None and len(incoming) >= 3 and math.prod(incoming[1:]) == in_ \
            and k != in_:
        cause = (f"{at} ({name}({in_}, {out})) got the {len(incoming)}-D input "
                 f"{_shape(incoming)}: a Linear works on the last dimension ({k} features), "
                 f"and the {' x '.join(map(str, incoming[1:]))} = {in_} values of each sample "
                 f"were never flattened")
        fix = (f"add Flatten() before {at}: it turns {_shape(incoming)} into "
               f"({incoming[0]}, {in_})")
        return ctx.explanation("missing_flatten", cause, fix, path)
    if module is None and k == out and k != in_:
        cause = (f"a Linear whose weight is ({out}, {in_}) (the matmul's second operand is "
                 f"the weight transposed, {in_}x{out}) received {k} features: the input matches "
                 f"the weight's first dim, not its second, so the sizes look swapped")
        fix = (f"is the weight transposed? the stored ({out}, {in_}) weight looks like an "
               f"(in, out) kernel: store W.T, shape ({in_}, {out}) (or load with linearkit's "
               f'layout="in_out"); if the layer really is {name}({in_}, {out}), make it '
               f"{name}({k}, {out})")
        return ctx.explanation("transposed_weight", cause, fix, path)
    if path is None:
        cause = (f"a {name}({in_}, {out}) receives {k} features (its input's last dim), not "
                 f"{in_}: the matmul's second operand (torch's mat2) is the weight transposed, "
                 f"{in_}x{out} = (in_features x out_features)")
    else:
        cause = (f"{at} is {name}({in_}, {out}): it takes {in_} input features, but the tensor "
                 f"reaching it has {k} features (its last dimension)")
    if k == out and k != in_:
        ctx.notes.append(f"the sizes look swapped: if the layer should map {k} -> {in_}, "
                         f"it is {name}({k}, {in_})")
    if in_ % k == 0 and in_ > k and incoming is None:
        ctx.notes.append(f"{in_} is a multiple of {k}: if the input is an image batch "
                         f"(N, C, H, W) with C*H*W = {in_}, a Flatten() is missing before it")
    fix = f"use {name}({k}, {out}) for {at} (the features it receives)"
    if path is None:
        fix = f"replace the {name}({in_}, {out}) by {name}({k}, {out})"
    return ctx.explanation("linear_in_features", cause, fix, path)


def _matmul(m, ctx):
    _, k, rows2, cols2 = map(int, m.groups())
    return linear_mismatch(ctx, k, rows2, cols2)


def _np_matmul(m, ctx):
    # NumPy's matmul names only the inner sizes: operand 1's rows and operand 0's columns
    rows, k = int(m.group(1)), int(m.group(2))
    found = ctx.failure()
    if found is not None and found.module is not None and not _is_linear(found.module):
        path, module = found.path, None  # a user's module: its forward did the matmul
    else:
        path, module, _ = ctx.locate(_is_linear, lambda mod: getattr(mod, "in_features", None)
                                     == rows and weight_shape(mod) is not None,
                                     f"Linear layers with in_features={rows}")
    if module is not None:
        out, in_ = weight_shape(module)
        return linear_mismatch(ctx, k, in_, out)
    cause = (f"a matmul A @ B got A with {k} columns (features) but B with {rows} rows"
             + ("" if path is None else f", in the forward of {where(path)}"))
    fix = (f"make B ({k}, ...): for a Linear's (out_features, in_features) weight W that is "
           f"x @ W.T, with in_features={k}")
    return ctx.explanation("matmul_inner_dim", cause, fix, path)


def layernorm_mismatch(ctx: Context, norm: tuple, got: tuple):
    """A LayerNorm over the last dims ``norm`` got an input of shape ``got``."""
    path, _, _ = ctx.locate(lambda m: hasattr(m, "normalized_shape"),
                                 lambda m: tuple(getattr(m, "normalized_shape", ())) == norm,
                                 f"LayerNorm({list(norm)})")
    width = tuple(got[-len(norm):]) if len(got) >= len(norm) else tuple(got)
    arg = str(width[0]) if len(width) == 1 else str(list(width))
    cause = (f"{where(path)} is LayerNorm({list(norm)}): it normalizes the last {len(norm)} "
             f"dim(s), which must be {list(norm)}, but its input {_shape(got)} ends with "
             f"{list(width)} (the layer before it changed the width)")
    return ctx.explanation("layernorm_shape", cause,
                           f"use LayerNorm({arg}) for {where(path)}", path)


def _layernorm(m, ctx):
    return layernorm_mismatch(ctx, ints(m.group(1)), ints(m.group(3)))


def batchnorm_mismatch(ctx: Context, channels: int, features: int):
    """A BatchNorm of ``features`` got an input with ``channels`` channels (dim 1)."""
    path, module, _ = ctx.locate(lambda m: hasattr(m, "num_features"),
                                 lambda m: getattr(m, "num_features", None) == features,
                                 f"BatchNorm layers of {features} features")
    name = _type(module, "BatchNorm1d")
    cause = (f"{where(path)} is {name}({features}) but its input has {channels} channels "
             f"(dim 1): its running statistics hold {features} entries, one per channel")
    return ctx.explanation("batchnorm_features", cause,
                           f"use {name}({channels}) for {where(path)}", path)


def _batchnorm(m, ctx):
    return batchnorm_mismatch(ctx, int(m.group(2)), int(m.group(3)))


def _batchnorm_rank(m, ctx):
    wanted = [int(g) for g in m.groups()[:2] if g]
    got = int(m.group(3))
    found = ctx.failure(lambda mod: hasattr(mod, "num_features"))
    path = None if found is None else found.path
    name = _type(None if found is None else found.module, "BatchNorm1d" if 2 in wanted
                 else "BatchNorm2d")
    better = {2: "BatchNorm1d", 3: "BatchNorm1d", 4: "BatchNorm2d", 5: "BatchNorm3d"}.get(got)
    cause = (f"{where(path)} ({name}) takes a {' or '.join(f'{w}-D' for w in wanted)} input "
             f"but got a {got}-D one")
    fix = (f"use {better} for {where(path)}" if better else "reshape the input") + \
        " (or reshape the input to the rank it takes)"
    return ctx.explanation("batchnorm_rank", cause, fix, path)


def _conv_rank(m, ctx):
    unbatched, batched, op, got = int(m.group(1)), int(m.group(2)), m.group(3), ints(m.group(4))
    want = op.replace("conv", "Conv").replace("transpose", "Transpose")
    path, module, _ = ctx.locate(lambda mod: hasattr(mod, "in_channels"),
                                 lambda mod: type(mod).__name__.lower() == op, want)
    cause = (f"{where(path)} ({op}) takes (C, ...) with {unbatched} dims or (N, C, ...) with "
             f"{batched}, but got {len(got)}-D {list(got)}")
    if len(got) < unbatched:
        cause += ": the input lost its channel/spatial dims (flattened too early, or a " \
                 "Flatten/Linear runs before the conv)"
        c = getattr(module, "in_channels", 1)
        spatial = batched - 2
        side = round((got[-1] / c) ** (1 / spatial)) if got and got[-1] % c == 0 else 0
        if len(got) == 2 and side and side ** spatial * c == got[-1]:
            fix = (f"reshape the input to (N, C, ...): x.view({got[0]}, {c}, "
                   f"{', '.join([str(side)] * spatial)}) before {where(path)}")
        else:
            fix = f"give {where(path)} an (N, C, ...) input of {batched} dims (x.unsqueeze(1) " \
                  f"adds a channel dim)"
    else:
        cause += ": it has an extra dimension"
        fix = f"remove the extra dim (x.squeeze(dim)) or use a {batched - 1}-D conv for it"
    return ctx.explanation("conv_input_rank", cause, fix, path)


def _pool_rank(m, ctx):
    found = ctx.failure()
    path = None if found is None else found.path
    got = None if found is None or found.incoming is None else len(found.incoming)
    cause = (f"a pooling layer ({where(path)}) takes a {m.group(1)}-D (C, H, W) or "
             f"{m.group(2)}-D (N, C, H, W) input" + (f", got {got}-D" if got else ""))
    return ctx.explanation("pool_input_rank", cause,
                           "give it an (N, C, H, W) input: do not flatten before the pooling",
                           path)


def _conv_channels(m, ctx):
    weight, got_ch = ints(m.group(2)), int(m.group(5))
    path, module, _ = ctx.locate(lambda mod: hasattr(mod, "in_channels"),
                                 lambda mod: tuple(mod.weight.shape) == weight,
                                 f"conv layers with a {list(weight)} weight")
    name = _type(module, f"Conv{len(weight) - 2}d")
    k = weight[2] if len(set(weight[2:])) == 1 else tuple(weight[2:])
    cause = (f"{where(path)} ({name}, weight {list(weight)}) takes {m.group(4)} input channels "
             f"but its input {list(ints(m.group(3)))} has {got_ch}")
    fix = f"use {name}({got_ch}, {weight[0]}, kernel_size={k}) for {where(path)}"
    return ctx.explanation("conv_channels", cause, fix, path)


def _view(m, ctx):
    found = ctx.failure()
    path = None if found is None else found.path
    cause = ("view() only reinterprets memory, and this tensor is not contiguous (it came from "
             "a transpose, permute, .T, expand or a strided slice), so no view of that shape "
             "exists" + ("" if path is None else
                         f"; it happened in the forward of {where(path)}"))
    fix = "use .reshape(...) (it copies only when it must), or .contiguous().view(...)"
    return ctx.explanation("view_noncontiguous", cause, fix, path)


def _reshape(m, ctx):
    shape, size = ints(m.group(1)), int(m.group(2))
    found = ctx.failure()
    path = None if found is None else found.path
    known = math.prod(d for d in shape if d != -1)
    cause = (f"{size} elements cannot be arranged as {list(shape)}" +
             (f": {size} is not a multiple of {known}" if -1 in shape else "") +
             ("" if path is None else f" (in the forward of {where(path)})"))
    fix = ("compute the size from the tensor instead of hard-coding it: x.flatten(1) or "
           "x.view(x.size(0), -1); check the batch size and the feature count")
    return ctx.explanation("reshape_size", cause, fix, path)


def _broadcast(m, ctx):
    a, b, dim = map(int, m.groups())
    found = ctx.failure()
    path = None if found is None else found.path
    cause = (f"an elementwise op got operands of size {a} and {b} at dim {dim}, and neither is "
             f"1, so they do not broadcast")
    if path is not None:
        cause += f"; it happened in the forward of {where(path)}"
    else:
        cause += (" (usually a residual add whose block changes the width, a loss whose target "
                  "has another shape than the prediction, or a parameter update with a "
                  "gradient of another shape)")
    fix = (f"make both {a} (or one of them 1) at dim {dim}: a residual block must end with as "
           f"many features as it starts with, a target must have the prediction's shape")
    return ctx.explanation("broadcast_mismatch", cause, fix, path)


def _invalid_gradient(m, ctx):
    fn, index, got, expected = m.group(1), int(m.group(2)), ints(m.group(3)), ints(m.group(4))
    name = fn[:-len("Backward")] if fn.endswith("Backward") and len(fn) > 8 else fn
    cause = (f"the backward of the autograd Function {name} returned, for input {index}, a "
             f"gradient of shape {list(got)}, but that input has shape {list(expected)}")
    if got == expected[::-1] and got != expected:
        fix = f"the gradient is transposed: return grad.T (shape {list(expected)}) from " \
              f"{name}.backward"
    else:
        fix = (f"return a gradient of shape {list(expected)} for input {index} from "
               f"{name}.backward (sum over broadcast dims with .sum(dim, keepdim=True))")
    return ctx.explanation("invalid_gradient", cause, fix)


def _grad_assign(m, ctx):
    got, shape = ints(m.group(1)), ints(m.group(2))
    cause = (f"a gradient of shape {list(got)} was assigned to a tensor of shape {list(shape)}:"
             f" .grad must have the tensor's own shape")
    fix = ("assign grad.T: it is transposed" if got == shape[::-1] and got != shape
           else f"assign a gradient of shape {list(shape)}")
    return ctx.explanation("grad_shape", cause, fix)


_NUM = r"(\d+)"
CLASSES = [
    (re.compile(rf"mat1 and mat2 shapes cannot be multiplied \({_NUM}x{_NUM} and {_NUM}x{_NUM}\)"),
     _matmul),
    (re.compile(rf"shapes \({_NUM},\s*{_NUM}\) and \({_NUM},\s*{_NUM}\) not aligned"), _matmul),
    (re.compile(r"matmul: Input operand 1 has a mismatch in its core dimension 0.*?\(size (\d+) "
                r"is different from (\d+)\)"), _np_matmul),
    (re.compile(r"Given normalized_shape=\[([\d,\s]*)\], expected input with shape "
                r"\[\*,?\s*([\d,\s]*)\], but got input of size\s*\[([\d,\s]*)\]"), _layernorm),
    (re.compile(r"running_(mean|var) should contain (\d+) elements not (\d+)"), _batchnorm),
    (re.compile(r"expected (\d)D(?: or (\d)D)? input \(got (\d)D input\)"), _batchnorm_rank),
    (re.compile(r"Expected (\d)D \(unbatched\) or (\d)D \(batched\) input to (\w+), but got "
                r"input of size: \[([\d,\s]*)\]"), _conv_rank),
    (re.compile(r"non-empty (\d)D or (\d)D \(batch mode\) tensor expected for input"), _pool_rank),
    (re.compile(r"Given groups=(\d+), weight of size \[([\d,\s]+)\], expected input"
                r"\[([\d,\s]+)\] to have (\d+) channels, but got (\d+) channels instead"),
     _conv_channels),
    (re.compile(r"view size is not compatible with input tensor's size and stride"), _view),
    (re.compile(r"shape '\[([-\d,\s]*)\]' is invalid for input of size (\d+)"), _reshape),
    (re.compile(r"The size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at "
                r"non-singleton dimension (\d+)"), _broadcast),
    (re.compile(r"Function (\w+) returned an invalid gradient at index (\d+) - got "
                r"\[([\d,\s]*)\] but expected shape compatible with \[([\d,\s]*)\]"),
     _invalid_gradient),
    (re.compile(r"assign a gradient of size '\[([\d,\s]*)\]' to a tensor of size "
                r"'\[([\d,\s]*)\]'"), _grad_assign),
]
