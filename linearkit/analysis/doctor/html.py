"""``DoctorReport.html()``: the report as ONE self-contained HTML page.

Everything is inline: the style sheet, the tables, and the plots as base64 PNG
(``<img src="data:image/png;base64,...">``), so the file opens offline, from an e-mail or an
artifact store, with no network. The plots need matplotlib (the ``plot`` extra), imported here
when the page is rendered and drawn on the Agg canvas (no pyplot state, no GUI backend); without
it the page holds the tables and says so.
"""

from __future__ import annotations

import base64
import html
import io
import math

from ..ledger import human_bytes
from .health import BANDS

__all__ = ["plots", "render_html"]

_STYLE = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1200px;padding:0 1em;color:#1d1d1f;background:#fff}
h1{font-size:1.5em;margin-bottom:.2em}h2{font-size:1.2em;margin-top:1.8em;
border-bottom:1px solid #ddd;padding-bottom:.2em}
table{border-collapse:collapse;font-size:.82em;margin:.6em 0}
th,td{border:1px solid #ddd;padding:.25em .5em;text-align:left;vertical-align:top}
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f4f4f6}
tr.bad td{background:#fff1f0}.verdict{padding:.8em 1em;border-radius:6px;margin:1em 0;
font-size:1.05em}.healthy{background:#eefbea;border:1px solid #9bd68b}
.sick{background:#fff1f0;border:1px solid #f0a39b}.note{color:#555;font-size:.9em}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto;font-size:.85em}
img{max-width:100%;border:1px solid #eee;margin:.5em 0}code{background:#f6f8fa;padding:0 .2em}
"""


def _e(s) -> str:
    return html.escape("" if s is None else str(s), quote=True)


def _g(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if v == 0:
        return "0"
    return f"{v:.{digits}g}" if 1e-3 <= abs(v) < 1e5 else f"{v:.{digits - 1}e}"


def _num(v) -> str:
    return "?" if v is None else f"{v:,}"


def _status(lay) -> str:
    """A layer's problems, or 'ok' (for a leaf in a block's branch, where the block is)."""
    if lay.problems:
        return "; ".join(lay.problems)
    return f"ok (in '{lay.within}')" if lay.within is not None else "ok"


def _shape(s) -> str:
    return "-" if s is None else "(" + ", ".join(map(str, s)) + ")"


def _table(header, rows, numeric=(), bad=()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for i, r in enumerate(rows):
        cells = "".join(f'<td class="n">{_e(c)}</td>' if j in numeric else f"<td>{_e(c)}</td>"
                        for j, c in enumerate(r))
        body.append(f'<tr class="bad">{cells}</tr>' if i in bad else f"<tr>{cells}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


# ---------------------------------------------------------------------------- plots
def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _positive(values):
    return [v if v is not None and v > 0 and math.isfinite(v) else float("nan") for v in values]


def _health_plot(report):
    from ..render import agg_figure

    h = report.health
    names = [lay.path or "(model)" for lay in h.layers]
    xs = list(range(len(names)))
    fig = agg_figure((max(7.0, 0.32 * len(names) + 3), 6.0), "matplotlib is needed")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    lo, hi = BANDS["activation"]
    ax1.axhspan(lo, hi, color="green", alpha=0.08, label="healthy band")
    ax1.plot(xs, _positive([lay.std / h.x_std if lay.std is not None and h.x_std else None
                            for lay in h.layers]), "o-", ms=3, label="output std / input std")
    ax1.set_yscale("log")
    ax1.set_ylabel("forward")
    ax1.grid(True, which="major", alpha=0.3)
    glo, ghi = BANDS["gradient"]
    ax2.axhspan(glo, ghi, color="green", alpha=0.08, label="healthy band")
    ax2.plot(xs, _positive([lay.grad_ratio for lay in h.layers]), "o-", ms=3, color="C1",
             label="‖dy‖ / ‖dL/d output‖")
    ax2.set_yscale("log")
    ax2.set_ylabel("backward")
    ax2.grid(True, which="major", alpha=0.3)
    for ax, first in ((ax1, h.first_activation), (ax2, h.first_gradient)):
        if first is not None:
            i = h.layers.index(first)
            ax.axvline(i, color="red", alpha=0.5, lw=1, label=f"first outside: {first.path}")
        ax.legend(loc="best", fontsize=7)
    ax2.set_xticks(xs)
    ax2.set_xticklabels([f"{n} {lay.type}" for n, lay in zip(names, h.layers)], fontsize=7,
                        rotation=90)
    ax1.set_title(f"health: {h.verdict}")
    fig.tight_layout()
    return fig


def _cost_plot(report):
    from ..render import agg_figure

    rows = [r for r in report.questions["rows"]
            if r["kind"] not in ("sequential", "residual", "container", "custom")
            and r["path"] != ""]
    names = [r["path"] for r in rows]
    xs = list(range(len(names)))
    fig = agg_figure((max(7.0, 0.32 * len(names) + 3), 4.5), "matplotlib is needed")
    ax1, ax2 = fig.subplots(1, 2)
    w = 0.4
    ax1.bar([x - w / 2 for x in xs], [r["flops"] or 0 for r in rows], w, label="forward")
    ax1.bar([x + w / 2 for x in xs], [r["backward_flops"] or 0 for r in rows], w,
            label="backward")
    ax1.set_title("FLOPs per layer")
    ax1.legend(fontsize=7)
    bottom = [0.0] * len(rows)
    for key, label in (("weights", "weights"), ("grads", "grads"), ("optimizer", "optimizer"),
                       ("activations", "saved activations")):
        vals = [(r["memory"][key] or 0) + (r["memory"]["master"] if key == "optimizer" else 0)
                for r in rows]
        ax2.bar(xs, vals, 0.6, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.set_title("memory per layer (bytes)")
    ax2.legend(fontsize=7)
    for ax in (ax1, ax2):
        ax.set_xticks(xs)
        ax.set_xticklabels(names, fontsize=7, rotation=90)
        ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def plots(report) -> dict[str, str] | None:
    """``{name: base64 PNG}`` of the report's plots, or None without matplotlib."""
    try:
        import matplotlib  # noqa: F401
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError:
        return None
    return {"health": _png(_health_plot(report)), "cost": _png(_cost_plot(report))}


def _img(data: str, alt: str) -> str:
    return f'<img src="data:image/png;base64,{data}" alt="{_e(alt)}">'


# ---------------------------------------------------------------------------- the page
def render_html(report) -> str:
    """The page for ``report`` (a ``DoctorReport``)."""
    m, p, h, q = report.model, report.probe, report.health, report.questions
    images = plots(report)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>linearkit doctor: {_e(m['name'])}</title>",
           f"<style>{_STYLE}</style></head><body>",
           f"<h1>linearkit doctor: {_e(m['name'])}</h1>",
           (f'<p class="note">{_e(m["source"])} model, {m["params"]:,} parameters; probe: '
           f"{'your batch x' if p['kind'] == 'user' else 'a random probe'} "
           f"{_e(_shape(p['shape']))} {_e(p['dtype'])}, "
           f"{'your targets' if p['targets']['kind'] == 'user' else 'random targets'}, loss "
           f"{_e(p['loss'])}</p>"),
           (f'<div class="verdict {"healthy" if h.verdict == "healthy" else "sick"}">'
           f"<b>Verdict: {_e(h.verdict)}</b> — {_e(h.summary)}</div>")]
    if images is None:
        out.append('<p class="note">matplotlib is not installed (pip install '
                   '"linearkit[plot]"): this page has tables only, no plots.</p>')
    for note in report.notes:
        out.append(f'<p class="note">note: {_e(note)}</p>')
    if m["unread"]:
        out.append("<p><b>Could not read</b> (answered for the rest):</p><ul>")
        out += [f"<li><code>{_e(u['path'] or '(model)')}</code> ({_e(u['type'])}): "
                f"{_e(u['reason'])}</li>" for u in m["unread"]]
        out.append("</ul>")

    # 1. the three questions
    out.append("<h2>1. The three questions: shapes, parameters, memory, FLOPs</h2>")
    rows = []
    for r in q["rows"]:
        mem = r["memory"]
        rows.append(["\u00a0\u00a0" * r["depth"] + (r["path"] or "(model)"), r["type"],
                     _shape(r["input_shape"]), _shape(r["output_shape"]), _num(r["params"]),
                     human_bytes(mem["weights"]), human_bytes(mem["grads"]),
                     human_bytes(mem["optimizer"] + mem["master"]),
                     human_bytes(mem["activations"]), _num(r["flops"]),
                     _num(r["backward_flops"])])
    out.append(_table(("path", "type", "input", "output", "params", "weights", "grads",
                       "optimizer state", "saved activations", "forward FLOPs",
                       "backward FLOPs"), rows, numeric=set(range(4, 11))))
    mem = q["memory"]
    out.append(f"<p>One training step ({_e(q['optimizer'] or 'inference')}, {_e(q['dtype'])}): "
               f"{_e(human_bytes(mem['total']))}; forward {_num(q['totals']['flops'])} FLOPs, "
               f"backward {_num(q['totals']['backward_flops'])} FLOPs.</p>")
    if images is not None:
        out.append(_img(images["cost"], "FLOPs and memory per layer"))
    if q["findings"]:
        out.append("<h3>Findings</h3><ul>")
        for f in q["findings"]:
            how = []
            if f["call"]:
                how.append(f"apply <code>{_e(f['call'])}</code>")
            if f["cli"]:
                pre = "after <code>lk.save(model, 'model.safetensors')</code>: " \
                    if f["needs_file"] else ""
                how.append(f"CLI {pre}<code>{_e(f['cli'])}</code>")
            if not how:
                how.append(f"no transform does this; fix: {_e(f['fix'])}")
            out.append(f"<li><b>[{_e(f['kind'])}]</b> {_e(', '.join(f['paths']))}: "
                       f"{_e(f['message'])} Saves {f['saving_params']:,} params, "
                       f"{f['saving_flops']:,} FLOPs/forward (negative: costs). "
                       f"{'; '.join(how)}.</li>")
        out.append("</ul>")
    else:
        out.append("<p>Findings: none.</p>")

    # 2. health
    out.append(f"<h2>2. Health on one batch ({'your x' if h.probe == 'user' else 'a random probe'}"
               f"; loss {_e(_g(h.loss))})</h2>")
    if images is not None:
        out.append(_img(images["health"], "activation and gradient scale per layer"))
    rows, bad = [], set()
    for i, lay in enumerate(h.layers):
        gw = max(lay.grad_to_weight.values()) if lay.grad_to_weight else None
        rows.append([lay.path or "(model)", lay.label or lay.type, _g(lay.mean), _g(lay.std),
                     _g(lay.max_abs),
                     "-" if lay.dead_units is None else f"{100 * lay.dead_units:.0f}%",
                     _g(lay.grad_out_norm), _g(lay.param_grad_norms.get("weight")), _g(gw),
                     _g(lay.act_ratio), _g(lay.grad_ratio), _status(lay)])
        if lay.problems:
            bad.add(i)
    out.append(_table(("layer", "type", "mean", "std", "max|y|", "dead units", "‖dy‖", "‖∇W‖",
                       "‖∇W‖/‖W‖", "std / std(x)", "‖dy‖ / ‖dy_out‖", "status"), rows,
                      numeric=set(range(2, 11)), bad=bad))
    lo, hi = BANDS["activation"]
    glo, ghi = BANDS["gradient"]
    wlo, whi = BANDS["grad_to_weight"]
    out.append(f'<p class="note">Bands: hidden activation std / input std in [{lo:g}, {hi:g}]; '
               f"gradient into a layer / gradient at the output in [{glo:g}, {ghi:g}]; "
               f"‖∇W‖/‖W‖ in [{wlo:g}, {whi:g}]; dead ReLU units below "
               f"{100 * BANDS['dead_units']:.0f}%; no layer of identical units.</p>")
    out.append(f"<p><b>Verdict:</b> {_e(h.summary)}</p>")
    if h.problems:
        out.append("<ul>" + "".join(f"<li>{_e(x)}</li>" for x in h.problems) + "</ul>")
    if h.remedies:
        out.append("<p><b>Remedies, most likely first:</b></p><ol>")
        for r in h.remedies:
            out.append(f"<li><b>{_e(r.what)}</b> — <code>{_e(r.call)}</code>: {_e(r.why)}"
                       f"<pre>{_e(r.code)}</pre></li>")
        out.append("</ol>")

    # 3. precision
    if report.precision is not None:
        pr = report.precision
        out.append(f"<h2>3. Precision readiness: {_e(pr['dtype'])}</h2>")
        rows = [[r["path"] or "(model)", r["type"], _g(r["max_abs"], 4),
                 f"{100 * r['subnormal']:.1f}%", f"{100 * r['flushed']:.1f}%",
                 _g(r["param_max_abs"], 4), r["flag"] or "ok"] for r in pr["rows"]]
        out.append(_table(("layer", "type", "max |output|", "below smallest normal",
                           "rounds to 0", "max |parameter|", "flag"), rows,
                          numeric={2, 3, 4, 5},
                          bad={i for i, r in enumerate(pr["rows"]) if r["flag"]}))
        fp = pr["first_problem"]
        out.append("<p>First layer at risk: " + ("none, every output and parameter fits."
                                                 if fp is None else
                                                 f"<code>{_e(fp['path'] or '(model)')}</code> "
                                                 f"({_e(fp['type'])}): {_e(fp['flag'])}.")
                   + "</p>")
        ls = pr["loss_scaling"]
        out.append(f"<p>Loss scaling: <b>{'needed' if ls['needed'] else 'not needed'}</b> — "
                   f"{_e(ls['why'])}</p>")

    # 4. correctness
    c = report.correctness
    out.append("<h2>4. Correctness</h2>")
    rows = [[g["type"], g["path"] or "(model)",
             {True: "ok", False: "FAILED", None: "not checked"}[g["ok"]], g["how"],
             _g(g["max_abs_error"]), _g(g["max_rel_error"]), g["error"] or ""]
            for g in c["gradcheck"]]
    out.append(_table(("layer type", "first at", "gradcheck", "on", "max abs error",
                       "max rel error", "error"), rows, numeric={4, 5},
                      bad={i for i, g in enumerate(c["gradcheck"]) if g["ok"] is False}))
    v = c["verify"]
    out.append("<p>verify: no reference given.</p>" if v is None else
               f"<p>verify against {_e(v.get('against') or 'the reference')}: "
               f"<b>{'ok' if v['ok'] else 'NOT ok' if v['ok'] is False else 'not run'}</b></p>"
               f"<pre>{_e(v['text'])}</pre>")

    # 5. runtime
    rt = report.runtime
    out.append(f"<h2>5. Runtime</h2><p>BLAS threads: {rt['threads']} (policy "
               f"{_e(rt['thread_policy'])}).</p>")
    for piece in rt["pieces"]:
        if piece["path"]:
            out.append(f"<p>piece <code>{_e(piece['path'])}</code></p>")
        out.append(f"<pre>{_e(piece['text'])}</pre>")
    out.append('<p class="note">' + _e(", ".join(f"{k} {v:.2f} s"
                                                 for k, v in report.seconds.items()))
               + "</p></body></html>")
    return "\n".join(out) + "\n"
