"""The doctor's other sections, each a plain dict built from the library's own tools:

* :func:`questions` — the three questions from the ledger (``analysis.ledger``): per layer its
  input and output shape, parameters, memory (weights, gradients, optimizer state, saved
  activations), forward and backward FLOPs; and the ledger's findings with the transform call
  and the ``linearkit compress`` command that removes each;
* :func:`precision` — ``analysis.range_check`` against a 16-bit dtype, the first layer at risk,
  and whether loss scaling is needed (the gradients of the health pass against the dtype);
* :func:`correctness` — ``analysis.gradcheck`` of each distinct layer type on a small float64
  copy, and ``io.verify`` against a reference;
* :func:`runtime` — ``runtime.explain``'s routes and the BLAS threads.
"""

from __future__ import annotations

import copy
import math
import os
import re

import numpy as np

from ... import precision as P
from ...core.module import Module
from ...layers import Linear

__all__ = ["correctness", "precision", "questions", "runtime"]


# ---------------------------------------------------------------------------- the three questions
def _own_params(module) -> list[tuple[int, int, int, bool, object]]:
    """``[(numel, itemsize, grad itemsize, trainable, key)]`` of ``module``'s own parameters
    (linearkit or torch), the gradient's dtype as each library keeps it."""
    out = []
    if isinstance(module, Module):
        for p in module.parameters(recurse=False):
            dt = p.data.dtype
            out.append((p.numel(), dt.itemsize, P.grad_dtype(dt).itemsize,
                        bool(p.requires_grad), id(p)))
    else:  # torch: gradients in the parameter's dtype
        for p in module.parameters(recurse=False):
            size = p.element_size()
            out.append((p.numel(), size, size, bool(p.requires_grad), id(p)))
    return out


def _row_memory(ledger, model, optimizer) -> dict[str, dict]:
    """Bytes per ledger row: ``weights``, ``grads``, ``master`` (float32 copy of a 16-bit
    trainable parameter), ``optimizer`` (states), ``activations`` (saved for backward, the
    ledger's), the way ``ledger()`` totals them; a container sums its children, a parameter
    shared by two modules counts at the first."""
    from ..ledger import OPTIMIZER_STATES

    states = 0 if optimizer is None else OPTIMIZER_STATES[optimizer]
    seen, own = set(), {}
    for row in ledger.rows:
        if row.path in own:
            continue
        try:
            module = model.get_submodule(row.path) if row.path else model
        except (AttributeError, KeyError):
            module = None
        mem = {"weights": 0, "grads": 0, "master": 0, "optimizer": 0}
        for numel, itemsize, grad_size, trainable, key in (
                _own_params(module) if module is not None else []):
            if key in seen:
                continue
            seen.add(key)
            mem["weights"] += numel * itemsize
            if trainable and optimizer is not None:
                master = 4 if itemsize == 2 else 0
                mem["grads"] += numel * grad_size
                mem["master"] += numel * master
                mem["optimizer"] += states * numel * (master or itemsize)
        own[row.path] = mem
    out = {}
    for row in ledger.rows:
        inside = [p for p in own if not row.path or p == row.path or p.startswith(row.path + ".")]
        mem = {k: sum(own[p][k] for p in inside) for k in ("weights", "grads", "master",
                                                            "optimizer")}
        mem["activations"] = row.saved_bytes
        out[row.path] = mem
    return out


_TRANSFORM = re.compile(r"^(?P<call>.*?)(?: \((?P<cli>linearkit [^)]*)\))?$")


def _fix(finding, file: str | None) -> dict:
    """The transform call and the CLI command that apply a ledger finding (or None)."""
    m = _TRANSFORM.match(finding.transform or "")
    call = m.group("call") if m and m.group("call") else None
    cli = m.group("cli") if m else None
    command = None
    if cli:
        words = cli.split()
        source = file or "model.safetensors"
        stem = os.path.splitext(os.path.basename(source))[0]
        command = " ".join(words[:2] + [source, "-o", f"{stem}-{finding.kind}.safetensors"]
                           + words[2:])
    return {"call": None if call is None else "lk." + call, "cli": command,
            "needs_file": bool(cli) and file is None}


def questions(ledger, model, optimizer, file: str | None) -> dict:
    """The three questions from ``ledger`` (an ``analysis.Ledger`` of ``model``)."""
    memory = _row_memory(ledger, model, optimizer)
    rows = []
    for row in ledger.rows:
        rows.append({
            "path": row.path, "type": row.type, "depth": row.depth, "kind": row.kind,
            "input_shape": None if row.input_shape is None else list(row.input_shape),
            "output_shape": None if row.output_shape is None else list(row.output_shape),
            "params": row.params, "trainable_params": row.trainable_params,
            "macs": row.macs, "flops": row.flops, "backward_macs": row.backward_macs,
            "backward_flops": row.backward_flops, "output_bytes": row.output_bytes,
            "memory": memory[row.path], "note": row.note})
    findings = []
    for f in ledger.findings:
        fix = _fix(f, file)
        findings.append({"kind": f.kind, "paths": list(f.paths), "message": f.message,
                         "fix": f.fix, "saving_params": f.saving_params,
                         "saving_flops": f.saving_flops, "transform": f.transform,
                         "call": fix["call"], "cli": fix["cli"],
                         "needs_file": fix["needs_file"], "text": str(f)})
    return {"rows": rows, "totals": dict(ledger.totals), "memory": dict(ledger.memory),
            "findings": findings, "notes": list(ledger.notes), "optimizer": optimizer,
            "dtype": ledger.dtype, "source": ledger.source,
            "conventions": ledger.conventions}


# ---------------------------------------------------------------------------- precision
def _fractions(arrays, normal: float, tiny: float, scale: float = 1.0) -> dict:
    """Over the nonzero finite entries of ``arrays`` (times ``scale``): how many, the fraction
    below ``normal`` (subnormal) and below ``tiny / 2`` (rounds to 0), the largest |value|."""
    count = below = flushed = 0
    top = 0.0
    for a in arrays:
        if a is None:
            continue
        v = np.abs(np.asarray(a, dtype=np.float64)).ravel() * scale
        v = v[np.isfinite(v) & (v > 0)]
        if not v.size:
            continue
        count += v.size
        below += int(np.count_nonzero(v < normal))
        flushed += int(np.count_nonzero(v < tiny / 2))
        top = max(top, float(v.max()))
    return {"entries": count, "subnormal": below / count if count else 0.0,
            "flushed": flushed / count if count else 0.0, "max_abs": top}


def precision(subject, dtype, health, ledger_fn) -> dict:
    """Precision readiness for ``dtype`` ('bfloat16', 'float16', ...): ``range_check`` of each
    piece on its input, the first layer at risk, loss scaling, and the ledger's memory if stored
    in ``dtype`` (``ledger_fn(dtype) -> Ledger``)."""
    from ..range_check import dtype_limits, range_check

    dt, top, normal, tiny = dtype_limits(dtype)
    rows = []
    for piece in subject.pieces:
        report = range_check(piece.module, piece.x, dt)
        for r in report.rows:
            rows.append({"path": piece.qualify(r.path), "type": r.type, "shape": list(r.shape),
                         "max_abs": r.max_abs, "subnormal": r.subnormal, "flushed": r.flushed,
                         "param_max_abs": r.param_max_abs, "flag": r.flag})
    first = next((r for r in rows if r["flag"]), None)
    params = _fractions(health.param_grads.values(), normal, tiny)
    acts = _fractions(health.dy.values(), normal, tiny)
    narrow = dt.itemsize == 2 and dt.kind == "f"  # float16: 5 exponent bits (bfloat16: 8)
    scale = None
    acts_text = (f" Activation gradients: {100 * acts['subnormal']:.1f}% below, "
                 f"{100 * acts['flushed']:.2f}% to 0 (linearkit computes them in float32; a "
                 f"framework that keeps them in {dt} needs the scale for them too).")
    if narrow:
        # the gradients at risk are those stored in float16: .grad under
        # precision.policy(grads="storage") (linearkit's default keeps float32 .grad for 16-bit
        # parameters) and every gradient in PyTorch's float16 training
        needed = params["subnormal"] > 0.01 or params["flushed"] > 0.001
        big = params["max_abs"]
        k = 24 if big == 0 else math.floor(math.log2(top / 16 / big))
        scale = 2.0 ** max(0, min(24, k))
        after = _fractions(health.param_grads.values(), normal, tiny, scale)
        why = (f"{100 * params['subnormal']:.1f}% of the nonzero gradient entries are below "
               f"{dt}'s smallest normal {normal:.3g} and {100 * params['flushed']:.2f}% round "
               f"to 0 when stored in {dt} (healthy: at most 1% and 0.1%)")
        if needed:
            why += (f"; scaled by 2^{int(math.log2(scale))} (the most this batch's largest "
                    f"gradient {big:.3g} allows with 16x headroom) "
                    f"{100 * after['subnormal']:.1f}% stay below. Use lk.amp.GradScaler() "
                    "(it starts at 2^16 and adapts), or train(precision='fp16'), which scales "
                    "for you.")
        else:
            why += ": the gradients fit float16 as they are."
        why += acts_text
    else:
        needed = False
        why = (f"{dt} has float32's exponent range (smallest normal {normal:.3g}): "
               f"{100 * params['subnormal']:.2g}% of the gradient entries are below it, so "
               "nothing underflows that float32 would keep.")
    stored = ledger_fn(dt)
    return {"dtype": str(dt), "max": top, "smallest_normal": normal, "smallest_subnormal": tiny,
            "rows": rows, "first_problem": first, "ready": first is None,
            "loss_scaling": {"needed": needed, "why": why, "suggested_scale": scale,
                             "param_grads": params, "activation_grads": acts},
            "memory_now": None, "memory_in_dtype": dict(stored.memory)}


# ---------------------------------------------------------------------------- correctness
_CHECK_BUDGET = 4096  # elements (inputs + parameters) a numeric check may perturb


def _first_inputs(piece) -> dict:
    """The input each module of ``piece`` receives first, by path: one forward of a copy."""
    twin = copy.deepcopy(piece.module)
    seen, handles = {}, []
    for name, module in twin.named_modules():
        def record(mod, args, name=name):
            if name not in seen and args and isinstance(args[0], np.ndarray):
                seen[name] = args[0]
        handles.append(module.register_forward_pre_hook(record))
    try:
        twin(piece.x)
    finally:
        for h in handles:
            h.remove()
    return seen


def _rows(x, n: int = 3) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return x[:n] if x.ndim > 1 else x


def _small_linear(m: Linear, x) -> tuple[Module, np.ndarray, str]:
    """A float64 Linear of at most 4 inputs and 3 outputs holding a corner of ``m``'s weights."""
    out_f, in_f = m.weight.data.shape
    i, o = min(in_f, 4), min(out_f, 3)
    small = Linear(i, o, bias=m.bias is not None, dtype=np.float64)
    small.weight.data[...] = np.asarray(m.weight.data[:o, :i], dtype=np.float64)
    if m.bias is not None:
        small.bias.data[...] = np.asarray(m.bias.data[:o], dtype=np.float64)
    small.train(m.training)
    xs = _rows(x).reshape(-1, in_f)[:3, :i] if x is not None else \
        np.random.default_rng(0).standard_normal((3, i))
    return small, np.ascontiguousarray(xs), f"Linear({i}, {o}) cut from its weights"


def _case_for(type_name: str):
    from ..cases import MODULE_CASES, build

    for case in MODULE_CASES:
        if case.id == type_name and not case.extra_shapes:  # a check takes one input
            module, x = build(case, np.float64)
            return module, x, f"the library's {case.id} case"
    return None


def _small_copy(m, x):
    """``(module, input, how)``: a small float64 copy of ``m`` to check, or None."""
    from ...rules import rule_for

    own = [p.data for p in m.parameters(recurse=False)]
    if not all(np.all(np.isfinite(np.asarray(a, dtype=np.float64))) for a in own) or (
            x is not None and not np.all(np.isfinite(np.asarray(x, dtype=np.float64)))):
        found = _case_for(type(m).__name__)  # the code is still checked, on finite values
        if found is None:
            return None
        module, xs, how = found
        return module, xs, how + " (its own weights or input hold non-finite values)"
    if getattr(rule_for(m), "kind", None) == "linear" and m.weight is not None:
        return _small_linear(m, x)
    if any(True for _ in m.children()):
        return _case_for(type(m).__name__)
    kind = getattr(rule_for(m), "kind", None)
    twin = copy.deepcopy(m)
    if any(True for _ in twin.parameters()) or any(True for _ in twin.buffers()):
        twin.to(np.float64)
    if x is None:
        return _case_for(type(m).__name__)
    xs = _rows(x)
    if kind in ("activation", "dropout", "identity") and xs.ndim >= 1 and xs.shape[-1] > 6:
        xs = xs[..., :6]  # elementwise: a few features check the same code
    elements = xs.size + sum(p.numel() for p in twin.parameters())
    if elements > _CHECK_BUDGET:
        return _case_for(type(m).__name__)
    return twin, np.ascontiguousarray(xs), f"a float64 copy on {xs.shape[0]} rows of its input"


def correctness(subject, reference) -> dict:
    """Gradcheck per distinct layer type; ``io.verify`` against ``reference`` (a torch module
    or a callable ``(B, *in) -> (B, *out)``; for a torch model converted whole, the torch model
    itself when no reference is given)."""
    from ...io.verify import verify
    from ..gradcheck import gradcheck
    from .subject import is_torch_module

    checks, done = [], set()
    for piece in subject.pieces:
        inputs = None
        for path, m in piece.module.named_modules():
            name = type(m).__name__
            if name in done:
                continue
            done.add(name)
            if inputs is None:
                inputs = _first_inputs(piece)
            entry = {"type": name, "path": piece.qualify(path), "ok": None, "how": None,
                     "max_abs_error": None, "max_rel_error": None, "error": None}
            try:
                small = _small_copy(m, inputs.get(path))
            except Exception as exc:  # noqa: BLE001 - a copy that cannot be made is reported
                small, entry["error"] = None, f"{type(exc).__name__}: {exc}"
            if small is None:
                entry["how"] = entry["error"] or "not checked: too large for a numeric check " \
                                                 "and no case of this type in the library table"
                checks.append(entry)
                continue
            module, xs, how = small
            entry["how"] = how
            try:
                result = gradcheck(module, xs)
                entry.update(ok=bool(result.ok), max_abs_error=result.max_abs_error,
                             max_rel_error=result.max_rel_error,
                             worst=None if result.worst is None else str(result.worst))
            except (ValueError, TypeError) as exc:
                entry["error"] = f"{type(exc).__name__}: {exc}"
            checks.append(entry)

    verified, label = None, None
    ref = reference
    if ref is None and subject.torch_model is not None and subject.model is not None:
        ref, label = subject.torch_model, "the torch model it was converted from"
    elif ref is not None:
        label = "a torch module" if is_torch_module(ref) else "a callable"
    if ref is not None:
        if subject.model is None:
            verified = {"ok": None, "text": "not run: the model did not convert to linearkit "
                                            "whole, so there is no single model to compare"}
        else:
            model, note = subject.model, ""
            if _has_random_or_batch_layers(model):  # compare the deterministic eval functions
                model = copy.deepcopy(model).eval()
                if hasattr(ref, "eval") and hasattr(ref, "training"):
                    ref = copy.deepcopy(ref).eval()
                note = " (both in eval mode: the model holds Dropout or BatchNorm)"
            rep = verify(model, ref, probe=subject.x)
            verified = {"ok": rep.ok, "against": label, "max_abs_error": rep.max_abs_error,
                        "max_rel_error": rep.max_rel_error, "mismatched": rep.mismatched,
                        "total": rep.total, "rtol": rep.rtol, "atol": rep.atol,
                        "worst": rep.worst, "text": str(rep) + note}
    return {"gradcheck": checks, "ok": all(c["ok"] is not False for c in checks),
            "verify": verified}


def _has_random_or_batch_layers(model) -> bool:
    from ...rules import rule_for

    return any(getattr(rule_for(m), "kind", None) in ("dropout", "batchnorm")
               for m in model.modules())


# ---------------------------------------------------------------------------- runtime
def runtime(subject) -> dict:
    """``runtime.explain`` of each piece on its input, and the BLAS threads in use."""
    from ...backend import threads
    from ...runtime.explain import explain

    pieces = []
    for piece in subject.pieces:
        rep = explain(piece.module, piece.x)
        children = [r for r in rep.rows if r.path and "." not in r.path] or rep.rows[:1]
        pieces.append({
            "path": piece.path, "text": rep.text(),
            "routes": [{"path": piece.qualify(r.path), "module": r.module, "forward": r.forward,
                        "vjp": r.vjp, "why_forward": r.why_forward, "why_vjp": r.why_vjp,
                        "gemm": r.gemm} for r in children],
            "rows": [{"path": piece.qualify(r.path), "module": r.module, "forward": r.forward,
                      "vjp": r.vjp, "why_forward": r.why_forward, "why_vjp": r.why_vjp,
                      "gemm": r.gemm} for r in rep.rows]})
    return {"threads": threads.get_num_threads(), "thread_policy": threads.get_policy(),
            "pieces": pieces}
