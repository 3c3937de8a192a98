"""``doctor()`` and the :class:`DoctorReport` it returns (``.text()``, ``.json()``, ``.html()``).

``doctor`` runs the sections in order — the three questions (the ledger), health (one batch
under ``analysis.stats``), precision readiness (``range_check``, when ``dtype`` is given),
correctness (``gradcheck`` per layer type, ``io.verify`` with a reference) and runtime
(``runtime.explain``, BLAS threads) — on copies of the model, so the model itself, its
gradients, BatchNorm statistics and random state are left exactly as they were.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
import time

import numpy as np

from ...core.random import default_generator
from ..ledger import human_bytes
from ..ledger import ledger as _ledger
from .health import BANDS, Health, examine
from .sections import correctness, precision, questions, runtime
from .subject import Subject, prepare

__all__ = ["DoctorReport", "doctor"]


def _json_safe(value):
    """``value`` as plain JSON: non-finite floats become None, tuples lists, NumPy scalars
    Python numbers."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return _json_safe(value.item())
    if isinstance(value, np.dtype):
        return str(value)
    return value


def _num(v) -> str:
    return "?" if v is None else f"{v:,}"


def _g(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    return f"{v:.{digits}g}" if 1e-3 <= abs(v) < 1e5 else f"{v:.{digits - 1}e}"


def _status(lay) -> str:
    """A layer's problems, or 'ok' (for a leaf in a block's branch, where the block is)."""
    if lay.problems:
        return "; ".join(lay.problems)
    return f"ok (in '{lay.within}')" if lay.within is not None else "ok"


def _shape(s) -> str:
    return "-" if s is None else "(" + ", ".join(map(str, s)) + ")"


def _table(header, rows, right=()) -> list[str]:
    cells = [list(map(str, header))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()

    return [line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]]


class DoctorReport:
    """Everything ``doctor`` found, section by section.

    Attributes
    ----------
    model : dict
        ``name``, ``source`` ('linearkit', 'torch' or 'file'), ``params``, ``unread`` (torch
        modules linearkit could not read: ``[{path, type, reason}]``), ``pieces``.
    probe : dict
        ``kind`` ('user' or 'random'), ``shape``, ``dtype``, ``targets``, ``loss``.
    ledger : Ledger
        The ``analysis.ledger`` report the three questions come from.
    questions, precision, correctness, runtime : dict
        The sections (``precision`` is None without ``dtype``).
    health : Health
        ``verdict``, ``summary``, ``layers``, ``remedies``, ... (``doctor.health``).
    seconds : dict
        Wall time of each section.
    """

    def __init__(self, subject: Subject, ledger, questions: dict, health: Health,
                 precision: dict | None, correctness: dict, runtime: dict, seconds: dict):
        self.subject = subject
        self.ledger = ledger
        self.questions = questions
        self.health = health
        self.precision = precision
        self.correctness = correctness
        self.runtime = runtime
        self.seconds = seconds
        self.model = {"name": subject.name, "source": subject.source,
                      "params": ledger.totals["params"], "file": subject.file,
                      "unread": [{"path": p, "type": t, "reason": r}
                                 for p, t, r in subject.unread],
                      "pieces": [p.path for p in subject.pieces]}
        self.probe = dict(subject.probe)
        self.notes = list(subject.notes)

    @property
    def verdict(self) -> str:
        """The health verdict: 'healthy', 'vanishing', 'exploding', 'symmetric', ..."""
        return self.health.verdict

    # ------------------------------------------------------------------ dict / json
    def to_dict(self) -> dict:
        """The whole report as JSON-able Python (non-finite floats as None)."""
        return _json_safe({
            "model": self.model, "probe": self.probe, "notes": self.notes,
            "verdict": self.health.verdict, "summary": self.health.summary,
            "questions": self.questions, "ledger": self.ledger.to_dict(),
            "health": self.health.to_dict(), "precision": self.precision,
            "correctness": self.correctness, "runtime": self.runtime,
            "seconds": self.seconds})

    def json(self, indent: int | None = None) -> str:
        """``to_dict()`` as a JSON string (strict: no NaN or Infinity)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False, default=str)

    def html(self, path=None) -> str:
        """One self-contained HTML page (plots as base64 PNG when matplotlib is installed);
        written to ``path`` when given. Returns the HTML."""
        from .html import render_html

        page = render_html(self)
        if path is not None:
            from ...storage.atomic import write_atomically

            write_atomically(str(path), page.encode("utf-8"), suffix=".html")
        return page

    # ------------------------------------------------------------------ text
    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return (f"<DoctorReport {self.model['name']}: {self.health.verdict}, "
                f"{self.model['params']:,} params>")

    def text(self, width: int = 100) -> str:
        """The report as plain text, section by section."""
        def wrap(s, indent="  ", first=None):
            return textwrap.wrap(s, width, initial_indent=first if first is not None else indent,
                                 subsequent_indent=indent + "  ")

        m, p, h = self.model, self.probe, self.health
        probe = ("your batch x" if p["kind"] == "user" else "a random probe") + \
            f" {_shape(p['shape'])} {p['dtype']}, " + \
            ("your targets y" if p["targets"]["kind"] == "user" else "random targets") + \
            f" {_shape(p['targets']['shape'])}, loss {p['loss']}"
        lines = [f"linearkit doctor: {m['name']} ({m['source']}), {m['params']:,} params",
                 f"probe: {probe}", ""]
        lines += wrap(f"VERDICT: {h.summary}", "", "")
        for note in self.notes:
            lines += wrap("note: " + note)
        if m["unread"]:
            lines.append("could not read (answered for the rest):")
            for u in m["unread"]:
                lines += wrap(f"'{u['path'] or '(model)'}' ({u['type']}): {u['reason']}", "    ",
                              "  - ")

        q = self.questions
        lines += ["", (f"1. THE THREE QUESTIONS (ledger; batch {_shape(self.ledger.input_shape)}, "
                      f"optimizer {q['optimizer'] or 'none (inference)'}, {q['dtype']})")]
        rows = []
        for r in q["rows"]:
            mem = r["memory"]
            rows.append(["  " * r["depth"] + (r["path"] or "(model)"), r["type"],
                         _shape(r["input_shape"]), _shape(r["output_shape"]), _num(r["params"]),
                         human_bytes(mem["weights"]), human_bytes(mem["grads"]),
                         human_bytes(mem["optimizer"] + mem["master"]),
                         human_bytes(mem["activations"]), _num(r["flops"]),
                         _num(r["backward_flops"])])
        lines += ["  " + s for s in _table(
            ("path", "type", "input", "output", "params", "weights", "grads", "optim state",
             "saved act.", "fwd FLOPs", "bwd FLOPs"), rows, right=set(range(4, 11)))]
        mem = q["memory"]
        lines.append(f"  one training step: {human_bytes(mem['total'])} (weights "
                     f"{human_bytes(mem['weights'])}, grads {human_bytes(mem['grads'])}, "
                     f"optimizer {human_bytes(mem['optimizer'] + mem['master'])}, activations "
                     f"{human_bytes(mem['activations'])}); forward {_num(q['totals']['flops'])} "
                     f"FLOPs, backward {_num(q['totals']['backward_flops'])} FLOPs")
        if q["findings"]:
            lines.append(f"  findings ({len(q['findings'])}):")
            for f in q["findings"]:
                save = []
                if f["saving_params"]:
                    save.append(f"{f['saving_params']:,} params")
                if f["saving_flops"]:
                    save.append(f"{f['saving_flops']:,} FLOPs/forward")
                head = (f"[{f['kind']}] {', '.join(x or '(model)' for x in f['paths'])}: "
                        f"{f['message']}")
                lines += wrap(head, "      ", "    - ")
                saving = (", ".join(save) if save else "none")
                lines += wrap(f"saves: {saving}" if not (f['saving_params'] < 0
                                                        or f['saving_flops'] < 0)
                              else f"changes: {saving} (negative: it costs)", "      ", "      ")
                if f["call"]:
                    lines += wrap(f"apply: {f['call']}", "      ", "      ")
                if f["cli"]:
                    pre = "after lk.save(model, 'model.safetensors'): " if f["needs_file"] else ""
                    lines += wrap(f"CLI: {pre}{f['cli']}", "      ", "      ")
                if not f["call"] and not f["cli"]:
                    lines += wrap(f"no transform does this; fix: {f['fix']}", "      ", "      ")
        else:
            lines.append("  findings: none")

        lines += ["", (f"2. HEALTH (one batch: {'your x' if h.probe == 'user' else 'a random probe'}"
                      f"; loss {_g(h.loss)})")]
        rows = []
        for lay in h.layers:
            gw = max(lay.grad_to_weight.values()) if lay.grad_to_weight else None
            pg = lay.param_grad_norms.get("weight", None)
            rows.append([lay.path or "(model)", lay.label or lay.type, _g(lay.mean), _g(lay.std),
                         _g(lay.max_abs), "-" if lay.dead_units is None else
                         f"{100 * lay.dead_units:.0f}%", _g(lay.grad_out_norm), _g(pg), _g(gw),
                         _g(lay.act_ratio), _g(lay.grad_ratio),
                         _status(lay)])
        lines += ["  " + s for s in _table(
            ("layer", "type", "mean", "std", "max|y|", "dead", "‖dy‖", "‖∇W‖", "‖∇W‖/‖W‖",
             "std/std(x)", "‖dy‖/‖dy_out‖", "status"), rows, right=set(range(2, 11)))]
        lo, hi = BANDS["activation"]
        glo, ghi = BANDS["gradient"]
        wlo, whi = BANDS["grad_to_weight"]
        lines += wrap(f"bands: hidden activation std / input std {lo:g}..{hi:g} (input std "
                      f"{_g(h.x_std)}); gradient into a layer / gradient at the output "
                      f"{glo:g}..{ghi:g} (‖dL/dout‖ = {_g(h.output_grad_norm)}); ‖∇W‖/‖W‖ "
                      f"{wlo:g}..{whi:g}; dead ReLU units below {100 * BANDS['dead_units']:.0f}%"
                      "; no layer of identical units")
        fa, fg = h.first_activation, h.first_gradient
        lines.append("  first outside the band: activations "
                     + ("none" if fa is None else f"'{fa.path}' ({_g(fa.act_ratio)}x)")
                     + "; gradients (from the loss) "
                     + ("none" if fg is None else f"'{fg.path}' ({_g(fg.grad_ratio)}x)"))
        lines += wrap(f"verdict: {h.summary}")
        for prob in h.problems:
            lines += wrap(f"also: {prob}")
        if h.remedies:
            lines.append("  remedies, most likely first:")
            for i, r in enumerate(h.remedies, 1):
                lines += wrap(f"{i}. {r.what} — {r.call}: {r.why}", "      ", "    ")
                lines += ["        " + c for c in r.code.splitlines()]
        for note in h.notes:
            lines += wrap("note: " + note)

        if self.precision is not None:
            pr = self.precision
            lines += ["", (f"3. PRECISION READINESS ({pr['dtype']}: max {_g(pr['max'], 4)}, "
                          f"smallest normal {_g(pr['smallest_normal'])})")]
            rows = [[r["path"] or "(model)", r["type"], _g(r["max_abs"], 4),
                     f"{100 * r['subnormal']:.1f}%", f"{100 * r['flushed']:.1f}%",
                     _g(r["param_max_abs"], 4), r["flag"] or "ok"] for r in pr["rows"]]
            lines += ["  " + s for s in _table(
                ("layer", "type", "max|y|", "subnormal", "to 0", "max|param|", "flag"), rows,
                right={2, 3, 4, 5})]
            fp = pr["first_problem"]
            lines.append("  first layer at risk: " + ("none, every output and parameter fits"
                                                      if fp is None else
                                                      f"'{fp['path'] or '(model)'}' "
                                                      f"({fp['type']}): {fp['flag']}"))
            ls = pr["loss_scaling"]
            lines += wrap(f"loss scaling: {'needed' if ls['needed'] else 'not needed'} — "
                          f"{ls['why']}")
            lines.append(f"  memory of one training step stored in {pr['dtype']}: "
                         f"{human_bytes(pr['memory_in_dtype']['total'])} (now "
                         f"{human_bytes(self.questions['memory']['total'])})")

        c = self.correctness
        lines += ["", "4. CORRECTNESS"]
        for g in c["gradcheck"]:
            status = {True: "ok", False: "FAILED", None: "not checked"}[g["ok"]]
            err = "" if g["max_abs_error"] is None else \
                f", max abs error {_g(g['max_abs_error'])}"
            lines += wrap(f"gradcheck {g['type']:<12} {status} ({g['how']}{err})"
                          + (f" — {g['error']}" if g["error"] else ""))
        v = c["verify"]
        if v is None:
            lines.append("  verify: no reference given (pass reference= a torch module or a "
                         "callable)")
        else:
            lines += wrap(f"verify against {v.get('against') or 'the reference'}: {v['text']}")

        rt = self.runtime
        lines += ["", f"5. RUNTIME (BLAS threads: {rt['threads']}, policy {rt['thread_policy']})"]
        for piece in rt["pieces"]:
            if piece["path"]:
                lines.append(f"  piece '{piece['path']}':")
            lines += ["  " + s for s in piece["text"].splitlines()]
        lines += ["", "(" + ", ".join(f"{k} {v:.2f} s" for k, v in self.seconds.items()) + ")"]
        return "\n".join(lines)


def doctor(model, x=None, y=None, *, input_shape=None, loss_fn=None, dtype=None,
           reference=None, optimizer: str | None = "adam", seed: int = 0,
           source_file: str | None = None) -> DoctorReport:
    """Examine ``model`` on one batch: cost, health, precision, correctness and runtime.

    Parameters
    ----------
    model : linearkit Module, torch ``nn.Module`` or a model file path
        A torch module is read through ``io.from_torch``; modules it cannot read are listed in
        ``report.model['unread']`` and the rest is answered for.
    x : array ``(B, *in)``, optional
        One real batch. Without it, a random standard normal probe of ``input_shape`` (default
        ``(64, in_features)`` of the first Linear).
    y : array, optional
        Targets for ``loss_fn``: class indices ``(B,)`` or values shaped like the output.
        Without them, random targets (class labels for a ``(B, C)`` output).
    input_shape : tuple of ints, optional
        The random probe's shape, batch first: ``(100, 40)``.
    loss_fn : optional
        Default ``CrossEntropyLoss`` for integer targets (or a ``(B, C)`` output without
        targets), else ``MSELoss``.
    dtype : 'bfloat16', 'float16', ..., optional
        Check precision readiness against this dtype.
    reference : torch module or callable ``(B, *in) -> (B, *out)``, optional
        Compared with the model by ``io.verify`` on ``x``.
    optimizer : 'adam', 'adamw', 'sgd-momentum', 'sgd' or None
        Whose states the memory budget counts (the ledger's ``optimizer``).
    seed : int
        Seeds the random probe and targets.
    source_file : str, optional
        The file ``model`` was loaded from: it names the model and goes into the findings'
        ``linearkit compress`` commands (a path given as ``model`` is its own).

    Returns
    -------
    DoctorReport
        ``.verdict``, ``.text()``, ``.json()``, ``.html(path)``.

    Examples
    --------
    >>> import numpy as np, linearkit as lk
    >>> from linearkit.analysis.doctor import doctor
    >>> model = lk.Sequential(lk.Linear(8, 16, rng=np.random.default_rng(0)), lk.ReLU(),
    ...                       lk.Linear(16, 4, rng=np.random.default_rng(1)))
    >>> report = doctor(model, input_shape=(32, 8))
    >>> report.verdict, report.probe["kind"]
    ('healthy', 'random')
    """
    # Layers built here (a small Linear to gradcheck) and a Dropout without its own generator
    # draw from the library generator: its state is put back, so the user's next draw is the
    # one it would have been.
    generator = default_generator()
    state = generator.bit_generator.state
    try:
        return _doctor(model, x, y, input_shape, loss_fn, dtype, reference, optimizer, seed,
                       source_file)
    finally:
        generator.bit_generator.state = state


def _doctor(model, x, y, input_shape, loss_fn, dtype, reference, optimizer, seed,
            source_file) -> DoctorReport:
    seconds: dict[str, float] = {}
    cache: dict = {}

    def ledger_of(m, shape, dt=None):
        key = (id(m), tuple(shape), None if dt is None else str(dt))
        if key not in cache:
            cache[key] = _ledger(m, shape, optimizer=optimizer, dtype=dt)
        return cache[key]

    t0 = time.perf_counter()
    subject = prepare(model, x, y, input_shape=input_shape, loss_fn=loss_fn, seed=seed,
                      ledger_output_shape=lambda m, shape: ledger_of(m, shape).rows[0]
                      .output_shape)
    if source_file is not None:
        subject.file, subject.name = str(source_file), os.path.basename(str(source_file))
    seconds["prepare"] = time.perf_counter() - t0

    t = time.perf_counter()
    led = ledger_of(subject.ledger_model, subject.x.shape)
    q = questions(led, subject.ledger_model, optimizer, subject.file)
    seconds["questions"] = time.perf_counter() - t

    t = time.perf_counter()
    types = {r.path: r.type for r in led.rows}
    health = examine(subject, types)
    seconds["health"] = time.perf_counter() - t

    prec = None
    if dtype is not None:
        t = time.perf_counter()
        prec = precision(subject, dtype, health,
                         lambda dt: ledger_of(subject.ledger_model, subject.x.shape, dt))
        prec["memory_now"] = dict(led.memory)
        seconds["precision"] = time.perf_counter() - t

    t = time.perf_counter()
    corr = correctness(subject, reference)
    seconds["correctness"] = time.perf_counter() - t

    t = time.perf_counter()
    rt = runtime(subject)
    seconds["runtime"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    return DoctorReport(subject, led, q, health, prec, corr, rt, seconds)
