"""The init-depth experiment's verdicts: each of the init claims, checked against the runs.

The words are chosen from the numbers: "barely moves" = less than 5% below the initial loss
(:func:`loss_drop`), "drops fast" = more than 30% below it, "at chance" / "does not converge" =
final training loss within 5% of ln 10 (:func:`is_stuck`), "clearly worse" = final loss more than
1.5x Kaiming's. :func:`summary_lines` and :func:`detail_lines` return markdown bullet lines.
"""

from __future__ import annotations

import math

from .init_depth import CHANCE, INITS, Result, Run

__all__ = ["detail_lines", "is_stuck", "loss_drop", "summary_lines"]


def loss_drop(r: Run, epoch: int) -> float:
    """Relative drop of the training loss from init to ``epoch``."""
    l0, lk = r.loss_after(0), r.loss_after(epoch)
    return (l0 - lk) / l0 if math.isfinite(l0) and math.isfinite(lk) and l0 > 0 else math.nan


def is_stuck(r: Run) -> bool:
    """Final training loss within 5% of chance (ln 10)."""
    return abs(r.final_loss - CHANCE) < 0.05 * CHANCE


def _where(cases) -> str:
    return ", ".join(f"{t} depth {d}" for t, d in cases) or "nowhere"


def _holds(found, everywhere) -> str:
    return "holds" if len(found) == len(everywhere) else "holds only in " + _where(found)


def summary_lines(result: Result) -> list[str]:
    """Each of the article's claims, with a verdict the script derives from the numbers."""
    c = result.config
    if not {"small", "kaiming"} <= set(c.inits):
        return []
    cases = [(t, d) for t in c.tasks for d in c.depths]
    get = result.get
    shallow = [(t, d) for t, d in cases if d == min(c.depths)]
    deep = [(t, d) for t, d in cases if d == max(c.depths)]
    out = []

    drops = [loss_drop(get(t, d, "kaiming"), 1) for t, d in cases]
    fast = [(t, d) for (t, d), x in zip(cases, drops) if x > 0.3]
    out.append(f"- *Kaiming drops fast in epoch 1*: {_holds(fast, cases)} "
               f"(training loss {100 * min(drops):.0f}-{100 * max(drops):.0f}% below its initial "
               "value after one epoch).")

    still = [(t, d) for t, d in shallow if loss_drop(get(t, d, "small"), 1) < 0.05]
    out.append(f"- *Small init barely moves in epoch 1 at depth {min(c.depths)}*: "
               f"{_holds(still, shallow)}.")

    if c.epochs >= 3:
        stuck8 = [(t, d) for t, d in shallow if is_stuck(get(t, d, "small"))]
        worse = [(t, d) for t, d in shallow if not is_stuck(get(t, d, "small"))
                 and get(t, d, "small").final_loss > 1.5 * get(t, d, "kaiming").final_loss]
        if len(stuck8) == len(shallow):
            verdict = (f"not what we measure — the failure is worse: at depth {min(c.depths)} "
                       f"the loss does not start to fall by epoch 3; it is still at chance after "
                       f"{c.epochs} epochs (like the article's depth-{max(c.depths)} case)")
        elif len(worse) + len(stuck8) == len(shallow):
            verdict = ("holds" if not stuck8 else
                       f"holds, or worse (still at chance in {_where(stuck8)})")
        else:
            verdict = "not reproduced in " + _where(
                [x for x in shallow if x not in worse and x not in stuck8])
        out.append(f"- *... starts to fall slowly by epoch 3 and converges to a clearly worse "
                   f"point*: {verdict}.")

    stuck16 = [(t, d) for t, d in deep if is_stuck(get(t, d, "small"))]
    out.append(f"- *At depth {max(c.depths)} the small init does not converge (loss stuck "
               f"high)*: {_holds(stuck16, deep)}.")

    if "default" in c.inits:
        dflt = [(t, d) for t, d in cases if is_stuck(get(t, d, "default"))]
        if dflt:
            out.append(f"- *Not in the article*: PyTorch's default init (`U(±1/√fan_in)`) is also "
                       f"still at chance after {c.epochs} epochs in: {_where(dflt)}.")
    if "xavier" in c.inits:
        xs = [(t, d) for t, d in cases if is_stuck(get(t, d, "xavier"))]
        slow = ", ".join(f"{t} depth {d}: {get(t, d, 'xavier').loss_after(3):.3g} vs "
                         f"{get(t, d, 'kaiming').loss_after(3):.3g}" for t, d in deep)
        later = all(get(t, d, "xavier").loss_after(3) > get(t, d, "kaiming").loss_after(3)
                    for t, d in deep)
        out.append(f"- Xavier (uniform) is still at chance in: {_where(xs)}; at depth "
                   f"{max(c.depths)} {'it starts later than Kaiming ' if later else ''}"
                   f"(loss@3, Xavier vs Kaiming: {slow}).")
    out += _adam_summary(result)
    return out


def _article_pattern(s: Run, k: Run) -> bool:
    """The article's depth-8 story: flat epoch 1, falling by epoch 3, ends clearly worse."""
    return (loss_drop(s, 1) < 0.05 and loss_drop(s, 3) >= 0.05 and not is_stuck(s)
            and s.final_loss > 1.5 * k.final_loss)


def _adam_summary(result: Result) -> list[str]:
    c = result.config
    if not result.adam_runs or not {"small", "kaiming"} <= set(c.adam_inits):
        return []
    task = result.adam_runs[0].task
    lo, hi = min(c.depths), max(c.depths)
    s, k = result.get(task, lo, "small", "adam"), result.get(task, lo, "kaiming", "adam")
    s16 = result.get(task, hi, "small", "adam")
    fits = _article_pattern(s, k)
    sgd_fits = _article_pattern(result.get(task, lo, "small"), result.get(task, lo, "kaiming"))
    story = ("does what the article describes" if fits else
             "does not follow the article's description either")
    line = (f"- *With Adam (lr {c.adam_lr}) instead of SGD* ({task}, supplement below): at depth "
            f"{lo} the small init {story} — {s.loss_after(0):.4g} -> {s.loss_after(1):.4g} in "
            f"epoch 1 ({100 * loss_drop(s, 1):.2f}% lower), {s.loss_after(3):.4g} after epoch 3, "
            f"{s.final_loss:.3g} at the end vs Kaiming's {k.final_loss:.3g}; at depth {hi} it ends "
            f"at {s16.final_loss:.4g} ({'at chance' if is_stuck(s16) else 'it trains'}).")
    if fits and not sgd_fits:
        line += (" So the article's picture matches an Adam-style optimizer; with SGD + momentum "
                 "at this learning rate the small init never gets going at all.")
    return [line]


def detail_lines(result: Result) -> list[str]:
    """Per task and depth: the small and Kaiming inits' losses, and which inits end at chance."""
    c = result.config
    lines: list[str] = []
    if not {"small", "kaiming"} <= set(c.inits):
        return lines
    for task in c.tasks:
        lines += ["", f"**{task}**", ""]
        for depth in c.depths:
            s, k = result.get(task, depth, "small"), result.get(task, depth, "kaiming")
            lines.append(
                f"- depth {depth}: N(0, 0.01²) {s.loss_after(0):.4g} -> {s.loss_after(1):.4g} "
                f"(epoch 1, {100 * loss_drop(s, 1):.2f}% lower) -> {s.loss_after(3):.4g} "
                f"(epoch 3) -> {s.final_loss:.4g} (epoch {len(s.train_loss) - 1}, "
                f"test {100 * s.test_acc:.1f}%); "
                f"Kaiming {k.loss_after(0):.4g} -> {k.loss_after(1):.4g} "
                f"({100 * loss_drop(k, 1):.1f}% lower) -> {k.loss_after(3):.4g} -> "
                f"{k.final_loss:.4g} (test {100 * k.test_acc:.1f}%).")
            stuck = [INITS[i][0] for i in c.inits if is_stuck(result.get(task, depth, i))]
            lines.append(f"- depth {depth}: within 5% of chance after {c.epochs} epochs: "
                         f"{', '.join(stuck) if stuck else 'none'}.")
    return lines
