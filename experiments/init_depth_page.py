"""The init-depth experiment's markdown page: :func:`write_page` writes it and both plots.

Every number on the page comes from the run (a :class:`~.init_depth.Result`); the verdict lines
come from :mod:`.init_depth_findings`, the plots from :mod:`.init_depth_plots`.
"""

from __future__ import annotations

import math
import os
import platform
from pathlib import Path

import numpy as np

from linearkit.analysis.render import markdown_table

from .init_depth import CHANCE, INITS, Result, relu_second_moments
from .init_depth_findings import detail_lines, summary_lines
from .init_depth_plots import plot_curves, plot_stats

__all__ = ["render_page", "write_page"]


def write_page(result: Result, out_dir, quick: bool, header: str) -> list[str]:
    """Write ``init_experiment{_quick}.md`` (under the ``header`` line of
    :mod:`experiments.provenance`) and its two PNGs under ``out_dir``; their paths."""
    from .provenance import with_header

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "init_experiment_quick" if quick else "init_experiment"
    curves = plot_curves(result, out / f"{stem}.png")
    stats = plot_stats(result, out / f"{stem}_stats.png")
    page = out / f"{stem}.md"
    page.write_text(with_header(render_page(result, curves.name, stats.name, quick), header),
                    encoding="utf-8")
    return [str(page), str(curves), str(stats)]


def _predicted_factor(init: str, width: int) -> float | None:
    """Predicted factor of E[h²] per hidden block (weights only; biases ignored)."""
    return {"small": width * 0.01 ** 2 / 2, "xavier": 0.5, "kaiming": 1.0, "default": 1 / 6,
            "constant": (0.01 * width) ** 2}.get(init)


def _factor_table(result: Result) -> str:
    c = result.config
    task, depth = c.tasks[0], max(c.depths)
    header = ("init", "predicted factor per block", "measured, first block",
              "measured, geometric mean over all blocks", "std of last / first hidden ReLU output")
    rows = []
    for init in c.inits:
        r = result.get(task, depth, init)
        relus, m = relu_second_moments(r.stats)
        first = m[1] / m[0] if len(m) > 1 and m[0] > 0 else math.nan
        ratio = (relus[-1].std / relus[0].std) if relus and relus[0].std else math.nan
        pred = _predicted_factor(init, c.width)
        meas = "-" if r.std_factor is None else f"{r.std_factor:.4g}"
        rows.append((INITS[init][0], f"{pred:.4g}", f"{first:.4g}", meas, f"{ratio:.3g}"))
    return markdown_table(header, rows, left={0})


def _default_floor(result: Result) -> str:
    """Predicted and measured std at which the default init's pre-activations settle."""
    c = result.config
    if "default" not in c.inits:
        return ""
    var_b = 1.0 / (3 * c.width)
    floor = math.sqrt(var_b / (1 - 1 / 6))
    r = result.get(c.tasks[0], max(c.depths), "default")
    lin = [s.std for s in r.stats.layers if s.type == "Linear"][1:-1]
    late = lin[len(lin) // 2:]
    measured = float(np.median(late)) if late else math.nan
    return (f"predicted `sqrt(Var(b) / (1 − 1/6))` = {floor:.3g} with `Var(b) = 1/(3·{c.width})`; "
            f"measured median over the deeper half of the hidden Linears: {measured:.3g}")


def _adam_eps_note(result: Result) -> str:
    """Why Adam cannot rescue the deepest small init: its gradients sit far below eps."""
    c = result.config
    runs = [r for r in result.adam_runs if r.init == "small" and r.depth == max(c.depths)]
    if not runs or runs[0].stats is None:
        return ""
    norms = [s.param_grad_norms["weight"] for s in runs[0].stats.layers
             if s.type == "Linear" and "weight" in s.param_grad_norms]
    if not norms:
        return ""
    return (f"\nAt depth {max(c.depths)} with N(0, 0.01²), `record_stats` measures weight-gradient "
            f"norms of {min(norms):.2g} to {max(norms):.2g} at init (whole matrices, so every "
            "element is smaller still). With gradients far below Adam's `eps = 1e-8`, Adam's "
            f"step is about `lr · g / eps` ≤ {c.adam_lr:g} · {max(norms):.2g} / 1e-8 = "
            f"{c.adam_lr * max(norms) / 1e-8:.2g} per weight: much larger than SGD's, and still "
            "far too small to matter.\n")


def render_page(result: Result, curves: str, stats: str, quick: bool) -> str:
    """The page's markdown; ``curves`` and ``stats`` are the plots' file names."""
    c = result.config
    runs_s = f"{result.seconds:.0f} s on {os.cpu_count()} CPU core(s) ({platform.machine()})"
    banner = ("> **Quick smoke run** (`--quick`: width 32, 256 samples, 3 epochs). Not the "
              "experiment; run `python -m experiments init-depth` for the real page.\n\n"
              if quick else "")
    init_list = ", ".join(f"{INITS[i][0]} (bias {INITS[i][1]})" for i in c.inits)
    n_stats = min(c.stats_batch, c.n_train or 4000)
    adam = ""
    if result.adam_runs:
        adam = f"""
## Supplement: the same networks with Adam

Adam (lr {c.adam_lr}, betas (0.9, 0.999), eps 1e-8) on {result.adam_runs[0].task}, everything
else unchanged. Adam divides each step by the running RMS of that parameter's gradient, so a
tiny gradient is not by itself a tiny step — until it is far below `eps`.

{result.to_markdown(result.adam_runs)}
{_adam_eps_note(result)}"""
    return f"""# Does init decide whether a deep MLP trains? (a popular experiment, reproduced)

{banner}Every number and both plots below come from the run named above
(`experiments/init_depth.py`; {runs_s}). Do not edit by hand.

## The claim

As usually described: an 8-layer fully connected network of width 256 on a simple classification
task with input dimension 128; only the init changes. With a fixed small-constant init ("0.01
量级") the loss barely moves in epoch 1, starts to fall slowly around epoch 3 and converges to a
clearly worse point; with Kaiming it drops fast in epoch 1. At 16 layers the small init does not
converge at all — the loss stays high — because the signal is squeezed towards zero layer by
layer.

## What we measured, in short

{chr(10).join(summary_lines(result))}

(Verdict words are chosen by the script: "barely moves" = less than 5% below the initial loss,
"drops fast" = more than 30% below it, "at chance" / "does not converge" = final training loss
within 5% of ln 10, "clearly worse" = final loss more than 1.5x Kaiming's.)

## The setup, exactly

- Model: {' and '.join(str(d) for d in c.depths)} Linear layers (ReLU between, none after the
  last), width {c.width}, {c.classes} classes, no normalization, no residuals, float32.
- Inits (every Linear the same way): {init_list}. "0.01 量级" is read as **N(0, 0.01²)**:
  the article's own init table lists it as "小常数随机 — 固定小值" (small random numbers of a
  fixed scale), it explains elsewhere that identical constants cannot break symmetry, and its
  mechanism (signal squeezed to zero) is what N(0, 0.01²) does. The literal reading, every weight
  = 0.01, is shown as its own row: it fails differently (see below).
- Tasks: **mnist1d** — MNIST-1D, input 40, 4,000 train / 1,000 test (`linearkit.data.mnist1d()`);
  **gmm128** — input 128 as in the article: 10 Gaussian classes, means
  `mu_c ~ N(0, {c.gmm_scale}²/128 · I)`, `x = mu_y + N(0, I)`, labels uniform, 4,000 train /
  1,000 test from `numpy.random.default_rng(128)` (a linear classifier reaches about 94% test
  accuracy on it).
- Training: SGD, lr {c.lr}, momentum {c.momentum}, batch {c.batch_size}, {c.epochs} epochs,
  cross-entropy; identical hyperparameters, weight seed and batch order for every init
  (seed {c.seed}). SGD because the article's claim is about plain SGD-style training; Adam is a
  supplement below.
- `loss@k`: cross-entropy on the whole training set after epoch k (`loss@0`: at init). Chance
  level is ln 10 = {CHANCE:.4f}. `test acc`: after the last epoch. `flags@init`: how many
  findings `linearkit.analysis.stats.record_stats` reports on {n_stats} training samples before
  training (activation std more than 10x off the first layer's, gradient norm more than 10x off
  the last layer's, ‖∇p‖/‖p‖ < 1e-5, or at least 99% exact zeros).

## Results

{result.to_markdown()}

![training loss per epoch]({curves})

### Per task
{chr(10).join(detail_lines(result))}

## Why: what each init does to the signal at init

One hidden block (Linear {c.width}→{c.width}, then ReLU) multiplies the second moment of the
activations by `fan_in · Var(w) / 2` at init (biases ignored). Predicted, and measured by
`record_stats` on the {max(c.depths)}-layer network ({c.tasks[0]}, before training):

{_factor_table(result)}

![per-layer statistics at init]({stats})

- **N(0, 0.01²)**: `{c.width} · 1e-4 / 2` per block, so the activations' std shrinks about
  {1 / math.sqrt(_predicted_factor("small", c.width)):.1f}x per layer, and the backward signal
  shrinks the same way: every weight's gradient is tiny at init (right panel), and SGD's steps
  are as tiny as the gradients.
- **constant 0.01**: every unit of a layer computes the same number, and gradient descent keeps
  it that way (identical units get identical gradients): the network is effectively one unit
  wide, however long it trains. Summing {c.width} equal inputs at weight 0.01 multiplies the
  signal by {0.01 * c.width:.2f} per layer (for inputs whose first pre-activation is positive;
  the rest die at the first ReLU). The 10 logits are identical too, so the initial loss is
  exactly ln 10, and the gradient flowing back into the hidden layers is `0.01 · Σ_c
  (softmax − onehot)_c`, which is zero up to rounding.
- **Xavier (uniform, gain 1)**: `{c.width} · (2 / {2 * c.width}) / 2 = 0.5` — made for tanh;
  with ReLU the second moment halves per block (std ×0.71).
- **Kaiming (normal, fan_in, ReLU gain √2)**: factor 1 by construction — the signal keeps its
  scale through all the layers.
- **PyTorch's default** (`U(±1/√fan_in)` for weight and bias, = `kaiming_uniform_(a=√5)`):
  `1/3 · 1/2 = 1/6` per block from the weights, so the first blocks shrink the signal; the bias,
  drawn from the same range, then holds the pre-activations at a floor instead of letting them
  vanish ({_default_floor(result)}). The signal that reaches the output is then mostly bias, not
  input, and the gradient reaching the first layers is small. It is not Kaiming init for ReLU.
{adam}
## Caveats

One seed, one learning rate per optimizer, {c.epochs} epochs, CPU float32: these numbers show
the mechanism, not a tuned benchmark. The per-layer factors at init do not depend on the
optimizer or the task; how long a badly scaled network takes to escape (if ever) does.
"""
