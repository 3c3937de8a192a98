"""Write docs/ledger.md: the ledger's worked examples and how its numbers map onto other tools'.

Run from the repository root:  python docs/gen_ledger.py
Every number in the page comes from this run. The other tools (fvcore, thop, ptflops, torchinfo)
are measured when they are installed (pip install fvcore thop ptflops torchinfo; they are not
dependencies of linearkit) and reported as "not installed" otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.metadata
import io
import os
import sys
import warnings

import numpy as np

import linearkit as lk
from linearkit.analysis.ledger import human_bytes, ledger

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "ledger.md")
BATCH = 64


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def block(text: str) -> str:
    return "```text\n" + text.rstrip() + "\n```\n"


def worked_examples() -> list[str]:
    rng = np.random.default_rng(0)
    out = ["## Worked examples\n",
           "Each line of the table below is asserted in `tests/test_ledger.py` too.\n",
           "| example | by hand | ledger |", "|---|---:|---:|"]
    big = ledger(lk.Linear(4096, 4096, rng=rng), (1, 4096))
    small = ledger(lk.Linear(512, 256, rng=rng), (64, 512), optimizer="adam")
    wide = ledger(lk.Linear(1024, 4096, rng=rng), (64, 128, 1024), rank_check=False)
    B = 64 * 128
    out += [
        (f"| `Linear(4096, 4096)` parameters | 4096·4096 + 4096 = 16,781,312 | "
        f"{big.totals['params']:,} |"),
        (f"| … float32 weights | 16,781,312 · 4 B = 64 MiB | {big.memory['weights']:,} B = "
        f"{human_bytes(big.memory['weights'])} |"),
        f"| `Linear(512, 256)` parameters | 512·256 + 256 = 131,328 | {small.totals['params']:,} |",
        f"| … float32 weights | 131,328 · 4 B = 525,312 B | {small.memory['weights']:,} B |",
        (f"| … training state with Adam | 131,328 · 16 B = 2,101,248 B | "
        f"{small.memory['training_state']:,} B |"),
        (f"| `Linear(1024, 4096)` on (64, 128, 1024): output | 64·128·4096 · 4 B = 134,217,728 B | "
        f"{wide[''].output_bytes:,} B |"),
        (f"| … forward FLOPs, 2·B·in·out + B·out, B = 8192 | {2 * B * 1024 * 4096 + B * 4096:,} | "
        f"{wide.totals['flops']:,} |"),
        (f"| … saved for backward (its input x, for dW) | 64·128·1024 · 4 B = 33,554,432 B | "
        f"{wide.memory['activations']:,} B |"),
        "",
        ("Training state = weights + gradients + Adam's two moments, 4 + 4 + 8 = 16 bytes per "
        "float32 parameter. Note the 134 MB output of the last example is *not* what its backward "
        "keeps: a Linear's backward needs its input (for dW = dyᵀx), not its output.\n"),
        "`print(ledger(lk.Linear(512, 256), (64, 512)))`:\n", block(str(small)),
    ]
    return out


def mlp_page(L) -> list[str]:
    return ["## A training step of the MNIST MLP (784-256-256-10, batch 64)\n",
            ("`linearkit ledger mlp-mnist --input-shape 64,784`, as Markdown "
            "(`ledger(...).to_markdown()`):\n"), L.to_markdown()]


# The findings example, shown on the page as it is and run to make the output shown under it
# (tests/test_docs_examples.py runs the page's copy and compares).
FINDINGS_CODE = """\
import numpy as np
import linearkit as lk
from linearkit.analysis.ledger import ledger

g = np.random.default_rng(1)
model = lk.Sequential(lk.Linear(64, 128, rng=g), lk.BatchNorm1d(128), lk.ReLU(),
                      lk.Linear(128, 128, rng=g), lk.Linear(128, 10, rng=g))
w = model[3].weight.data                # layer 3's weight: a rank-4 matrix
w[:] = g.standard_normal((128, 4)) @ g.standard_normal((4, 128)) / 16
print("\\n\\n".join(str(f) for f in ledger(model, (32, 64)).findings))
"""


def findings_example() -> list[str]:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(FINDINGS_CODE, {})
    return ["## Findings\n",
            ("Redundant linear structure, each with the fix, what it saves (a negative saving "
            "is a cost) and the call that applies it:\n"),
            "```python\n" + FINDINGS_CODE + "```\n", block(printed.getvalue())]


def bias_proof() -> list[str]:
    g = np.random.default_rng(4)
    x = g.standard_normal((16, 8))
    lin = lk.Linear(8, 6, dtype=np.float64, rng=g)
    no_bias = x @ lin.weight.data.T
    ln, bn = lk.LayerNorm(6, dtype=np.float64), lk.BatchNorm1d(6, dtype=np.float64)
    d_ln = np.abs(ln(lin(x)) - ln(no_bias)).max()
    d_bn = np.abs(bn(lin(x)) - bn(no_bias)).max()
    return ["## A bias before a normalization\n",
            ("Removing the bias of `Linear(8, 6)` (float64, batch 16) changes what follows by at "
            "most:\n"),
            "| followed by | max abs change of the output |", "|---|---:|",
            f"| `LayerNorm(6)` | {d_ln:.3g} |", f"| `BatchNorm1d(6)` (train mode) | {d_bn:.1e} |",
            "",
            ("BatchNorm subtracts each feature's mean over the batch, which removes any "
            "per-feature constant exactly: the bias is wasted (`bias-before-batchnorm` finding). "
            "LayerNorm subtracts the mean over the features of each sample, which removes only "
            "the bias's mean across features — the rest of the bias survives, so the ledger "
            "never reports a bias before LayerNorm as redundant.\n")]


def measure_tools(L) -> list[str]:
    """Run each tool on the same PyTorch MLP and express its number in the ledger's terms."""
    import torch
    from torch import nn
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10))
    x = torch.zeros(BATCH, 784)
    T = ledger(model, (BATCH, 784)).totals
    macs, bias, elem = T["macs"], T["bias_flops"], T["elementwise_flops"]
    per_layer_bias = sum(r.info["out"] for r in L.rows if r.kind == "linear" and r.info["bias"])
    forms = {  # a tool's number, said in the ledger's terms
        "MACs": macs,
        "MACs + bias adds (1 per output element)": macs + bias,
        "MACs + bias adds + ReLU elements": macs + bias + elem,
        "MACs + bias adds + ReLU elements counted twice": macs + bias + 2 * elem,
        "MACs + bias once per layer (out_features)": macs + per_layer_bias,
        "2·MACs": 2 * macs,
        "2·MACs + bias adds": 2 * macs + bias,
        "FLOPs": T["flops"],
        "backward: 2·backward MACs": 2 * T["backward_macs"],
    }

    def relation(value):
        for text, v in forms.items():
            if v == value:
                return text
        return f"no simple relation (MACs {value - macs:+,})"

    rows = []  # (tool, version, what it reports, value)
    with FlopCounterMode(display=False) as fwd:
        y = model(x)
    with FlopCounterMode(display=False) as bwd:
        y.sum().backward()
    model.zero_grad(set_to_none=True)
    torch_v = version("torch")
    rows.append(("torch FlopCounterMode", torch_v, "forward FLOPs", fwd.get_total_flops()))
    rows.append(("torch FlopCounterMode", torch_v, "backward FLOPs", bwd.get_total_flops()))
    missing = []
    quiet = contextlib.redirect_stdout(io.StringIO())
    try:
        from fvcore.nn import FlopCountAnalysis

        fa = FlopCountAnalysis(copy.deepcopy(model), x)
        fa.unsupported_ops_warnings(False)
        fa.uncalled_modules_warnings(False)
        rows.append(("fvcore FlopCountAnalysis", version("fvcore"), "total()", int(fa.total())))
    except ImportError:
        missing.append("fvcore")
    try:
        import thop

        with quiet:
            t_macs, t_params = thop.profile(copy.deepcopy(model), inputs=(x,), verbose=False)
        rows.append(("thop profile", version("thop"), "macs", int(t_macs)))
        rows.append(("thop profile", version("thop"), "params", int(t_params)))
    except ImportError:
        missing.append("thop")
    try:
        import ptflops

        for backend in ("pytorch", "aten"):
            with contextlib.redirect_stdout(io.StringIO()):
                p_macs, p_params = ptflops.get_model_complexity_info(
                    copy.deepcopy(model), (784,), input_constructor=lambda _: {"input": x},
                    as_strings=False, print_per_layer_stat=False, backend=backend)
            rows.append((f"ptflops ({backend} backend)", version("ptflops"), "MACs",
                         int(p_macs)))
        rows.append(("ptflops", version("ptflops"), "params", int(p_params)))
    except ImportError:
        missing.append("ptflops")
    try:
        import torchinfo

        s = torchinfo.summary(copy.deepcopy(model), input_size=(BATCH, 784), verbose=0)
        v = version("torchinfo")
        rows.append(("torchinfo summary", v, "Total mult-adds", int(s.total_mult_adds)))
        rows.append(("torchinfo summary", v, "Total params", int(s.total_params)))
        rows.append(("torchinfo summary", v, "Forward/backward pass size (B)",
                     int(s.total_output_bytes)))
    except ImportError:
        missing.append("torchinfo")

    out = ["## How the numbers map onto other tools\n",
           (f"The same MLP as a PyTorch `nn.Sequential`, batch {BATCH}, measured with each tool "
           "installed here. The ledger reports, for this model: "
           f"**{T['params']:,}** params, **{macs:,}** MACs, **{T['flops']:,}** forward FLOPs "
           f"(= 2·MACs {2 * macs:,} + bias adds {bias:,} + ReLU {elem:,}), "
           f"**{T['backward_macs']:,}** backward MACs, **{T['backward_flops']:,}** backward "
           f"FLOPs, outputs of all layers {T['output_bytes']:,} B, saved for backward "
           f"{L.memory['activations']:,} B.\n"),
           "| tool | version | reports | value | in ledger terms |", "|---|---|---|---:|---|"]
    for tool, ver, what, value in rows:
        if what.lower().endswith("params"):
            rel = "params" if value == T["params"] else f"params {value - T['params']:+,}"
        elif "pass size" in what:
            rel = (f"sum of layer outputs ({T['output_bytes']:,} B) "
                   f"{value - T['output_bytes']:+,} B; the bytes really saved for backward are "
                   f"{L.memory['activations']:,} B")
        else:
            rel = relation(value)
        out.append(f"| {tool} | {ver} | {what} | {value:,} | {rel} |")
    out += ["", "Not measured (not installed here): " + (", ".join(missing) or "none") + ".\n",
            ("The last column is found by this script: it matches each tool's number against "
            "sums of the ledger's components. To compare with a tool, pick the matching "
            "figures: `totals['macs']`, `totals['gemm_flops']` (= 2·MACs), "
            "`totals['bias_flops']`, `totals['elementwise_flops']`, `totals['backward_macs']`.\n")]
    return out


def parse_args(argv=None) -> argparse.Namespace:
    """The command line: no options (``--help`` says what the script does)."""
    parser = argparse.ArgumentParser(prog="python docs/gen_ledger.py",
                                     description=__doc__.splitlines()[0])
    return parser.parse_args(argv)


def main(argv=None) -> int:
    parse_args(argv)
    sys.path.insert(0, ROOT)   # experiments.provenance: the header of every generated page
    from experiments.provenance import header_line

    header = header_line("python docs/gen_ledger.py")
    warnings.filterwarnings("ignore")
    mlp = ledger("mlp-mnist", (BATCH, 784))
    parts = ["# The ledger: parameters, FLOPs, memory and redundant structure\n", header + "\n",
             "<!-- generated by docs/gen_ledger.py; edit that script, not this file -->\n",
             ("`linearkit.analysis.ledger(model, input_shape)` reports, per module and in total, "
             "parameters, MACs, forward and backward FLOPs and the memory of one training step, "
             "for linearkit models, PyTorch `nn.Module`s and `.safetensors` files, and names "
             "redundant linear structure with the fix and the saving.\n"),
             ("```python\nimport linearkit as lk\nfrom linearkit.analysis.ledger import ledger\n"
             "L = ledger(lk.Linear(512, 256), (64, 512), optimizer=\"adam\")\n"
             "print(L)            # aligned table + totals + memory + conventions + findings\n"
             "L.totals['flops'], L.memory['total'], L.findings, L.to_markdown(), L.to_dict()\n"
             "```\n"),
             "## Conventions\n",
             ("- **MACs**: multiply-adds of the matmuls; a `Linear(in, out)` on an input with "
             "leading dims multiplying to B does B·in·out."),
             ("- **FLOPs** = 2 per multiply-add + one add per output element for a bias "
             "(`2·B·in·out + B·out`) + nominal elementwise costs (`ELEMENTWISE_FLOPS`: ReLU 1 per "
             "element, norms 5–7, a transcendental counts as 1)."),
             ("- **Backward FLOPs**: dX GEMM 2·B·in·out only if something before the layer is "
             "trainable (never for the first layer or a frozen prefix — `Sequential.vjp`'s rule), "
             "dW GEMM 2·B·in·out only for a trainable weight, B·out for a trainable bias."),
             ("- **Memory**: weights, gradients (trainable only), optimizer states (Adam/AdamW 2 "
             "per trainable parameter, SGD with momentum 1, SGD 0), a float32 master copy under "
             "mixed precision, and the activations the backward closures really keep (a "
             "Linear's input, a ReLU's output, Dropout's mask, a norm's normalized input and "
             "statistics; an array kept by two closures counted once). The test suite walks the "
             "closures of `model.vjp` and finds exactly these bytes.\n")]
    parts += worked_examples()
    parts += mlp_page(mlp)
    parts += findings_example()
    parts += bias_proof()
    parts += measure_tools(mlp)
    with open(OUT, "w") as f:
        f.write("\n".join(parts))
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
