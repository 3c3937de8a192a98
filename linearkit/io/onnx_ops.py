"""What each ONNX operator ``import_onnx`` reads means, as linearkit modules.

Each converter takes the reader (``onnx_import._Reader``: the node's constants, attributes,
opset and the chain's dtype), the node and the shape of the chain's value, and returns
``(modules, output shape)``, or raises the reader's FormatError naming the node. A converter
imports a node only when the modules compute exactly what the ONNX operator at that opset
computes for every input the graph admits; anything else is refused.

Shapes are tracked without data: a shape is a tuple of dims or None (rank unknown), and a dim
is a monomial ``(c, syms)`` standing for ``c * prod(syms)``: ``(3, ())`` is a known 3,
``(1, ("batch",))`` a symbolic dim (an ONNX ``dim_param``, or a fresh name for a dim the graph
leaves open), ``(12, ("batch",))`` their product after a Flatten. Two dims are known equal
when their monomials are equal, which holds for every value of the symbols.

This module imports nothing optional (``onnx`` is not needed here).
"""

from __future__ import annotations

import numpy as np

from .. import layers as L
from ..layers.linear import linear_from

__all__ = ["READ_OPS", "VERSIONS", "convert"]

# op_type -> the operator versions (schema since_version) whose semantics the converters
# implement. A version not listed is refused by name: the older ones below carry legacy
# attributes (Gemm's and Add's 'broadcast', BatchNormalization's 'is_test'/'spatial',
# Dropout's 'is_test', Reshape's 'shape' attribute) that change what the node computes.
VERSIONS = {
    "Gemm": {7, 9, 11, 13}, "MatMul": {1, 9, 13},
    "Add": {7, 13, 14}, "Mul": {7, 13, 14}, "Div": {7, 13, 14}, "Erf": {9, 13},
    "Relu": {1, 6, 13, 14}, "LeakyRelu": {1, 6, 16}, "Tanh": {1, 6, 13}, "Sigmoid": {1, 6, 13},
    "Gelu": {20}, "Softmax": {1, 11, 13}, "LogSoftmax": {1, 11, 13},
    "LayerNormalization": {17}, "BatchNormalization": {7, 9, 14, 15},
    "Flatten": {1, 9, 11, 13, 21, 23, 24, 25}, "Reshape": {5, 13, 14, 19, 21, 23, 24, 25},
    "Identity": {1, 13, 14, 16, 19, 21, 23, 24, 25}, "Dropout": {7, 10, 12, 13, 22},
    "Constant": {1, 9, 11, 12, 13, 19, 21, 23, 24, 25},
}
#: Every op_type import_onnx reads (Add, Mul, Div and Erf only inside the patterns it knows).
READ_OPS = frozenset(VERSIONS)

# ----------------------------------------------------------------------------- symbolic dims


def known(dim) -> int | None:
    """The dim's value when it is a number, else None."""
    return dim[0] if not dim[1] else None


def dim_of(value: int):
    return (int(value), ())


def product(dims):
    """The monomial of the product of ``dims``."""
    c, syms = 1, []
    for d_c, d_syms in dims:
        c *= d_c
        syms.extend(d_syms)
    return (c, tuple(sorted(syms)))


def quotient(a, b):
    """``a / b`` as a monomial when it is one for every value of the symbols, else None."""
    if b[0] == 0 or a[0] % b[0]:
        return None
    rest = list(a[1])
    for s in b[1]:
        if s not in rest:
            return None
        rest.remove(s)
    return (a[0] // b[0], tuple(rest))


def dim_str(dim) -> str:
    c, syms = dim
    names = ["?" if s.startswith("?") else s for s in syms]
    return "*".join(([str(c)] if c != 1 or not names else []) + names)


def shape_str(shape) -> str:
    if shape is None:
        return "(unknown rank)"
    inner = ", ".join(dim_str(d) for d in shape)
    return f"({inner},)" if len(shape) == 1 else f"({inner})"


def merge_plan(shape, target):
    """The runs ``[(start, end), ...]`` of neighbouring dims of ``shape`` whose products are
    ``target``'s dims, one run per target dim, or None when no such partition exists (a split,
    a permutation, an inserted or dropped dim of size 1 linearkit's Flatten cannot make)."""
    memo = {}

    def solve(i, j):
        if (i, j) in memo:
            return memo[(i, j)]
        found = None
        if j == len(target):
            found = [] if i == len(shape) else None
        else:
            for end in range(i, len(shape)):
                if product(shape[i:end + 1]) == target[j]:
                    rest = solve(end + 1, j + 1)
                    if rest is not None:
                        found = [(i, end)] + rest
                        break
        memo[(i, j)] = found
        return found

    return solve(0, 0)


def flattens(plan) -> list:
    """Flatten modules that merge each run of ``plan`` (right to left, so the indices of the
    runs still to merge do not move)."""
    return [L.Flatten(s, e) for s, e in reversed(plan) if e > s]


# ----------------------------------------------------------------------------- converters


def _same(r, node, shape, module):
    return [module], shape


def _leaky_relu(r, node, shape):
    return [L.LeakyReLU(r.attr(node, "alpha", 0.01))], shape


def _gelu(r, node, shape):
    approximate = r.attr(node, "approximate", "none")
    if approximate not in ("none", "tanh"):
        r.fail(f"approximate='{approximate}': expected 'none' or 'tanh'", node)
    if r.dtype == np.float64:
        # Gelu's function body holds its constants as float32: onnxruntime and onnx's
        # reference differ from an exact float64 GELU by up to ~1e-8
        r.fail("a float64 Gelu: ONNX defines it with float32 constants, so its float64 output "
               "differs from linearkit's GELU by up to ~1e-8", node,
               "export the float64 model with opset < 20, which writes the GELU formula with "
               "float64 constants")
    return [L.GELU(approximate)], shape


def _softmax(r, node, shape):
    """Softmax-13 normalizes one axis (default -1). Softmax-1/11 normalize the input coerced
    to 2-D, ``(prod(shape[:axis]), prod(shape[axis:]))`` (default axis=1): the same thing
    only when at most one of ``shape[axis:]`` can differ from 1."""
    cls = L.Softmax if node.op_type == "Softmax" else L.LogSoftmax
    version = r.version(node)
    rank = None if shape is None else len(shape)
    if version >= 13:
        axis = r.attr(node, "axis", -1)
        if rank is not None and not -max(rank, 1) <= axis < max(rank, 1):
            r.fail(f"axis={axis} is out of range for an input of shape {shape_str(shape)}", node)
        return [cls(axis)], shape
    axis = r.attr(node, "axis", 1)
    what = (f"{node.op_type}-{version} (opset {r.opset}) normalizes the input flattened from "
            f"axis={axis} on")
    hint = (f"export with opset >= 13, where {node.op_type} normalizes one axis, or apply it "
            "to the last axis (axis=-1)")
    if rank is None:
        if axis == -1:
            return [cls(-1)], shape
        r.fail(f"{what}, and the input's rank is not known: expected axis=-1 or a graph input "
               "with a shape", node, hint)
    start = axis + rank if axis < 0 else axis
    if not 0 <= start < rank:
        r.fail(f"{what}: expected an axis in [{-rank}, {rank - 1}] for an input of shape "
               f"{shape_str(shape)}", node, hint)
    spread = [j for j in range(start, rank) if known(shape[j]) != 1]
    if len(spread) > 1:
        dims = shape_str(shape[start:])
        r.fail(f"{what}: dims {dims} of an input of shape {shape_str(shape)} together; "
               "linearkit's Softmax normalizes one axis", node, hint)
    return [cls((spread[0] if spread else rank - 1) - rank)], shape


def row_bias(r, node, c, n_out: int, rank, what: str):
    """A bias ``c`` added to an output ``(..., n_out)`` of rank ``rank`` (None: unknown) as
    ``(n_out,)``, or a FormatError when it is not the same for every row: a Linear's bias is
    one row. Accepted: ``()``, ``(1,)``, ``(n_out,)``, ``(1, n_out)``, ``(1, 1)``, and more
    leading 1s up to the output's rank."""
    shape = tuple(c.shape)
    if rank is None and c.ndim > 1:
        r.fail(f"its {what} has shape {shape} and the output's rank is not known: expected a "
               f"bias of shape ({n_out},)", node, "give the graph input a shape")
    if rank is not None and c.ndim > rank:
        r.fail(f"its {what} has shape {shape}, more dims than the output (rank {rank}): adding "
               "it would broadcast the output to a higher rank, which a Linear does not do",
               node, f"store the bias as ({n_out},)")
    last = shape[-1] if shape else 1
    if last not in (1, n_out):
        r.fail(f"its {what} has shape {shape}, which does not broadcast to (..., {n_out})", node)
    if any(d != 1 for d in shape[:-1]):
        r.fail(f"its {what} has shape {shape}: it varies by row (expected the same bias for "
               f"every row: (), ({n_out},) or (1, {n_out})); a Linear's bias cannot vary by row",
               node, f"if the rows are equal, store one row, shape ({n_out},)")
    return np.broadcast_to(c.reshape(shape[-1:]), (n_out,)).astype(r.dtype)


def _features(r, node, shape, k: int, what: str):
    if shape is not None and (not shape or known(shape[-1]) not in (None, k)):
        r.fail(f"{what} expects inputs of shape (..., {k}), the chain's value has shape "
               f"{shape_str(shape)}", node)


def linear(r, w_out_in: np.ndarray, b, scale: float = 1.0) -> L.Linear:
    """A Linear ``(*, in) -> (*, out)`` with ``weight = scale * w_out_in`` ``(out, in)`` (a
    view such as a transpose is fine: it is copied once, into the layer) and bias b. Built
    without a random init (``layers.linear.linear_from``): every value is assigned."""
    m = linear_from(w_out_in, b, r.dtype)
    if scale != 1.0:
        m.weight.data *= scale
    return m


def _gemm(r, node, shape):
    """``Y = alpha A B + beta C`` (B transposed when transB=1) on ``A (M, K)``: a Linear with
    ``weight = alpha B (N, K)`` and ``bias = beta C`` reduced to ``(N,)``."""
    if r.attr(node, "transA", 0):
        r.fail("transA=1 (the input transposed) has no Linear equivalent", node,
               "export the model with the input as (batch, features) and transA=0")
    if shape is not None and len(shape) != 2:
        r.fail(f"Gemm multiplies a 2-D input (M, K); the chain's value has shape "
               f"{shape_str(shape)}", node)
    b = r.weight(node, 1, "weight B")
    if b.ndim != 2:
        r.fail(f"its weight B has shape {b.shape}; expected 2-D", node)
    w = b if r.attr(node, "transB", 0) else b.T  # B is r.dtype already (r.weight checks it)
    _features(r, node, shape, w.shape[1], "its weight")
    c = r.weight(node, 2, "bias C", optional=True)
    bias = None if c is None else row_bias(r, node, c * r.attr(node, "beta", 1.0), w.shape[0],
                                           2, "bias C")
    out = None if shape is None else shape[:-1] + (dim_of(w.shape[0]),)
    return [linear(r, w, bias, r.attr(node, "alpha", 1.0))], out


def matmul(r, node, shape):
    """``x @ W`` with ``W (K, N)``: a Linear ``(*, K) -> (*, N)`` without bias (the loop
    fuses a following Add of a constant into its bias)."""
    w = r.weight(node, 1, "weight")
    if w.ndim != 2:
        r.fail(f"its weight has shape {w.shape}; a Linear needs 2-D (in, out)", node,
               "a MatMul by a vector or a batch of matrices has no Linear equivalent")
    if shape is not None and not shape:
        r.fail("MatMul of a 0-d input", node)
    _features(r, node, shape, w.shape[0], "its weight")
    out = None if shape is None else shape[:-1] + (dim_of(w.shape[1]),)
    return [linear(r, w.T, None)], out


def _layer_norm(r, node, shape):
    """Normalizes dims ``axis..`` (default -1); ``Scale``/``B`` broadcast to them (ONNX's
    unidirectional broadcasting) become LayerNorm's weight/bias of the normalized shape."""
    axis = r.attr(node, "axis", -1)
    rank = None if shape is None else len(shape)
    if rank is None and axis >= 0:
        r.fail(f"axis={axis} and the input's rank is not known", node,
               "give the graph input a shape, or use a negative axis")
    if rank is not None and not -rank <= axis < rank:
        r.fail(f"axis={axis} is out of range for an input of shape {shape_str(shape)}", node)
    k = -axis if axis < 0 else rank - axis
    if r.attr(node, "stash_type", 1) not in (1, 11):
        r.fail(f"stash_type={r.attr(node, 'stash_type', 1)}: expected 1 (float32) or 11 "
               "(float64) statistics", node)
    scale = r.weight(node, 1, "scale")
    bias = r.weight(node, 2, "bias B", optional=True)
    params = []
    for p, what in ((scale, "scale"), (bias, "bias B")):
        if p is not None:
            if rank is not None and p.ndim > rank:
                r.fail(f"its {what} has shape {p.shape}, more dims than the input "
                       f"{shape_str(shape)}: it does not broadcast to the input", node)
            while p.ndim > k and p.shape[0] == 1:  # leading 1s broadcast away
                p = p[0]
            if p.ndim > k:
                r.fail(f"its {what} has shape {p.shape}: it varies along dims before axis="
                       f"{axis}, which LayerNorm's per-element affine cannot", node)
            p = p.reshape((1,) * (k - p.ndim) + p.shape)
        params.append(p)
    dims = [None] * k if shape is None else [known(d) for d in shape[len(shape) - k:]]
    target = []
    for j, d in enumerate(dims):
        sizes = [p.shape[j] for p in params if p is not None]
        if d is None and max(sizes) == 1:
            r.fail(f"it normalizes dim {j - k} of open size (input {shape_str(shape)}) with a "
                   "scale of size 1 there; linearkit's LayerNorm needs the normalized shape",
                   node, "give the graph input that dim's size")
        target.append(d if d is not None else max(sizes))
    target = tuple(target)
    for p, what in zip(params, ("scale", "bias B")):
        if p is not None and any(s not in (1, t) for s, t in zip(p.shape, target)):
            r.fail(f"its {what} has shape {p.shape}, which does not broadcast to the normalized "
                   f"dims {target}", node)
    m = L.LayerNorm(target, eps=r.attr(node, "epsilon", 1e-5), bias=bias is not None,
                    dtype=r.dtype)
    m.weight.data[...] = np.broadcast_to(params[0], target)
    if bias is not None:
        m.bias.data[...] = np.broadcast_to(params[1], target)
    return [m], shape


def _batch_norm(r, node, shape):
    """Inference BatchNormalization of ``(N, C)`` or ``(N, C, L)``: a BatchNorm1d in eval
    mode with the running statistics."""
    if r.attr(node, "training_mode", 0):
        r.fail("training_mode=1: import_onnx reads inference BatchNormalization", node,
               "export the model in eval mode")
    if r.version(node) == 7 and not r.attr(node, "spatial", 1):
        r.fail("spatial=0 (statistics per element, not per channel) has no BatchNorm1d "
               "equivalent", node)
    if shape is not None and len(shape) not in (2, 3):
        r.fail(f"input of shape {shape_str(shape)}: linearkit's BatchNorm1d takes (N, C) or "
               "(N, C, L)", node)
    params = [r.weight(node, i, what, cast=True) for i, what in
              enumerate(("scale", "bias B", "mean", "var"), 1)]
    c = params[0].size
    channels = None if shape is None else known(shape[1])
    for p, what in zip(params, ("scale", "bias B", "mean", "var")):
        if p.shape != (channels if channels is not None else c,):
            r.fail(f"its {what} has shape {p.shape}; expected ({channels or c},), one value per "
                   "channel", node)
    m = L.BatchNorm1d(c, eps=r.attr(node, "epsilon", 1e-5), dtype=r.dtype)
    m.weight.data[...], m.bias.data[...] = params[0], params[1]
    m.running_mean[...], m.running_var[...] = params[2], params[3]
    return [m.eval()], shape


def _flatten(r, node, shape):
    """ONNX Flatten: ``(prod(shape[:axis]), prod(shape[axis:]))`` (default axis=1), as the
    Flatten modules that merge those runs of dims."""
    axis = r.attr(node, "axis", 1)
    if shape is None:
        if axis == 1:  # right for every rank >= 2; linearkit refuses a 1-D input at run time
            return [L.Flatten(1, -1)], None
        r.fail(f"axis={axis} and the input's rank is not known", node,
               "give the graph input a shape")
    rank = len(shape)
    start = axis + rank if axis < 0 else axis
    if not 0 <= start <= rank:
        r.fail(f"axis={axis} is out of range for an input of shape {shape_str(shape)}", node)
    target = (product(shape[:start]), product(shape[start:]))
    plan = merge_plan(shape, target)
    if plan is None:
        r.fail(f"axis={axis} on an input of shape {shape_str(shape)} gives "
               f"{shape_str(target)}, a new dim of size 1 that linearkit's Flatten cannot "
               "insert", node, "flatten with 0 < axis < rank")
    return flattens(plan), target


def reshape_target(r, node, shape):
    """The output shape ONNX Reshape gives an input of ``shape`` (0 copies the input's dim
    unless allowzero=1, -1 is inferred), as monomials, or a FormatError when it cannot be
    known for every input the graph admits."""
    target = r.const(node, 1, "shape")
    if target.ndim != 1 or target.dtype.kind not in "iu":
        r.fail(f"its shape input has shape {target.shape} and dtype {target.dtype}; expected a "
               "1-D int64 tensor", node)
    target = [int(v) for v in target]
    allowzero = r.attr(node, "allowzero", 0)
    described = f"reshape of {shape_str(shape)} to {target}"
    if shape is None:
        r.fail(f"{described}: the input's shape is not known", node,
               "give the graph input a shape")
    if target.count(-1) > 1 or any(v < -1 for v in target):
        r.fail(f"{described}: expected at most one -1 and no other negative entry", node)
    if allowzero and 0 in target:
        r.fail(f"{described} with allowzero=1: a 0 makes an empty dim, which a Flatten does "
               "not", node)
    out = []
    for j, v in enumerate(target):
        if v == 0:
            if j >= len(shape):
                r.fail(f"{described}: entry {j} is 0 (copy the input's dim) but the input has "
                       f"{len(shape)} dims", node)
            out.append(shape[j])
        else:
            out.append(None if v == -1 else dim_of(v))
    total = product(shape)
    if None in out:
        j = out.index(None)
        inferred = quotient(total, product(d for d in out if d is not None))
        if inferred is None:
            r.fail(f"{described}: the -1 cannot be inferred for every input the graph admits "
                   f"(the input's size is {dim_str(total)})", node,
                   "give the graph input a static shape, or reshape with 0 and -1 only")
        out[j] = inferred
    elif product(out) != total:
        r.fail(f"{described}: {target} holds {dim_str(product(out))} elements, the input "
               f"{dim_str(total)}; it fits only some inputs", node,
               "reshape with 0 (copy a dim) and -1 (infer one), e.g. [0, -1]")
    return tuple(out)


def _reshape(r, node, shape):
    """A Reshape imports as the Flatten(s) that give exactly its output shape, else not."""
    out = reshape_target(r, node, shape)
    plan = merge_plan(shape, out)
    if plan is None:
        r.fail(f"reshape of {shape_str(shape)} to {shape_str(out)} is not a merge of "
               "neighbouring dims (a split, a reordering or an added dim), and linearkit's "
               "Flatten only merges", node)
    return flattens(plan), out


def _dropout(r, node, shape):
    """Dropout at inference is the identity; a training-mode one (Dropout-12+'s third input
    true) zeroes elements at random, which is refused."""
    if r.version(node) >= 12 and len(node.input) > 2 and node.input[2]:
        if node.input[2] not in r.consts:
            r.fail(f"its training_mode '{node.input[2]}' is computed; expected a constant "
                   "false", node, "export the model in eval mode")
        if bool(np.asarray(r.consts[node.input[2]]).any()):
            r.fail("a training-mode Dropout (training_mode is true): its output is random", node,
                   "export the model in eval mode")
    return [], shape


_CONVERTERS = {
    "Relu": lambda r, n, s: _same(r, n, s, L.ReLU()),
    "Tanh": lambda r, n, s: _same(r, n, s, L.Tanh()),
    "Sigmoid": lambda r, n, s: _same(r, n, s, L.Sigmoid()),
    "LeakyRelu": _leaky_relu, "Gelu": _gelu, "Softmax": _softmax, "LogSoftmax": _softmax,
    "Gemm": _gemm, "MatMul": matmul, "LayerNormalization": _layer_norm,
    "BatchNormalization": _batch_norm, "Flatten": _flatten, "Reshape": _reshape,
    "Dropout": _dropout, "Identity": lambda r, n, s: ([], s),
}


def convert(r, node, shape):
    """``(modules, output shape)`` for a single node on the chain's value of ``shape``; None
    for an op that only appears inside a pattern or a residual (Add, Mul, Div, Erf)."""
    fn = _CONVERTERS.get(node.op_type)
    return None if fn is None else fn(r, node, shape)
