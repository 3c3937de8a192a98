"""``analysis.doctor``: the verdicts a per-layer computation predicts, figures equal to the
ledger's and the stats', the torch path, the self-contained HTML page, the CLI entry point, the
walkthrough in docs/doctor.md, and the time of a whole report on the README's model.

The four health cases (a trained recipe model, a 0.01-scale init, a 0.2-scale init, a constant
init) are checked against the band definitions applied to a direct NumPy computation of each
layer's output, not against the doctor's own numbers.
"""

from __future__ import annotations

import argparse
import base64
import copy
import itertools
import json
import pathlib
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser

import numpy as np
import pytest

import linearkit as lk
from linearkit.analysis.doctor import BANDS, DoctorUsageError, doctor, run
from linearkit.analysis.stats import record_stats

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "doctor.md"
DEPTH, WIDTH = 16, 256


# ---------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def batch():
    """100 MNIST-1D training rows ``x (100, 40)`` float32 and their labels ``y (100,)``."""
    data = lk.data.mnist1d()
    return data.x_train[:100], data.y_train[:100]


@pytest.fixture(scope="module")
def trained():
    """The README's recipe model (40 -> 100 ReLU -> residual 100 ReLU -> 10), 300 steps."""
    model, _ = lk.train.train("mlp", steps=300, eval_every=0)
    return model


def deep_relu(std=None, const=None, seed=0):
    """16 Linear layers 40 -> 256 -> ... -> 10 with a ReLU after each but the last; weights
    N(0, std^2) with zero biases (a popular tutorial's recipe), or every parameter ``const``."""
    rng = np.random.default_rng(seed)
    sizes = [40] + [WIDTH] * (DEPTH - 1) + [10]
    layers = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        linear = lk.Linear(n_in, n_out)
        if const is not None:
            for p in linear.parameters():
                lk.init.constant_(p, const)
        else:
            linear.weight.data[...] = rng.normal(0.0, std, (n_out, n_in))
            linear.bias.data[...] = 0.0
        layers += [linear, lk.ReLU()] if i < DEPTH - 1 else [linear]
    return lk.Sequential(*layers)


def direct_outputs(model, x):
    """Each child's output ``(100, width)``, computed with NumPy (x @ W.T + b, max(0, z))."""
    h, outs = x, []
    for m in model:
        h = h @ m.weight.data.T + m.bias.data if isinstance(m, lk.Linear) else np.maximum(h, 0)
        outs.append(h)
    return outs


def first_out_of_band(model, x):
    """The path of the first hidden layer whose output std / the input's std leaves the
    activation band, by direct computation (the last Linear, the logits, is not hidden)."""
    lo, hi = BANDS["activation"]
    ref = x.astype(np.float64).std()
    for i, out in enumerate(direct_outputs(model, x)[:-1]):
        r = out.astype(np.float64).std() / ref
        if not lo <= r <= hi:
            return str(i), r
    return None, None


# ---------------------------------------------------------------------------- the four cases
def test_a_model_trained_with_the_recipe_is_healthy(trained, batch):
    x, y = batch
    report = doctor(trained, x, y)
    assert report.verdict == "healthy", report.health.summary
    assert report.health.first_activation is None and report.health.first_gradient is None
    assert report.health.remedies == []
    assert report.probe["kind"] == "user" and report.probe["targets"]["kind"] == "user"


def test_a_tiny_init_vanishes_at_the_depth_the_direct_computation_collapses(batch):
    x, y = batch
    model = deep_relu(std=0.01)
    expected, ratio = first_out_of_band(model, x)
    assert expected is not None and ratio < BANDS["activation"][0]
    report = doctor(model, x, y)
    assert report.verdict == "vanishing"
    assert report.health.first_activation.path == expected
    # every layer's std is the directly computed one
    for i, out in enumerate(direct_outputs(model, x)):
        assert report.health.layer(str(i)).std == pytest.approx(out.astype(np.float64).std(),
                                                                rel=1e-4)
    # the gradient collapses too, from the loss back (a direct backward of the mean CE loss)
    outs = direct_outputs(model, x)
    p = np.exp(outs[-1] - outs[-1].max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    g = (p - np.eye(10)[y]) / len(y)
    norms = {str(len(outs) - 1): np.linalg.norm(g)}
    for i in range(len(outs) - 1, 0, -1):
        m = model[i]
        g = g @ m.weight.data if isinstance(m, lk.Linear) else g * (outs[i - 1] > 0)
        norms[str(i - 1)] = np.linalg.norm(g)
    lo = BANDS["gradient"][0]
    from_loss = [k for k in map(str, range(len(outs) - 1, -1, -1))
                 if norms[k] / norms[str(len(outs) - 1)] < lo]
    assert report.health.first_gradient.path == from_loss[0]
    assert "lk.init.kaiming_normal_" in report.health.remedies[0].call
    assert [r.call for r in report.health.remedies][1:] == ["lk.LayerNorm", "lk.Residual"]


def test_an_over_scaled_init_explodes(batch):
    x, y = batch
    model = deep_relu(std=0.2)
    expected, ratio = first_out_of_band(model, x)
    assert expected is not None and ratio > BANDS["activation"][1]
    report = doctor(model, x, y)
    assert report.verdict == "exploding"
    assert report.health.first_activation.path == expected
    calls = [r.call for r in report.health.remedies]
    assert "lk.init.kaiming_normal_" in calls[0] and "lk.optim.clip_grad_norm_" in calls


def test_a_constant_init_never_breaks_symmetry(batch):
    x, y = batch
    model = deep_relu(const=0.05)
    outs = direct_outputs(model, x)
    report = doctor(model, x, y)
    assert report.verdict == "symmetric"
    assert "symmetry never broken" in report.health.summary
    for i, m in enumerate(model):
        if isinstance(m, lk.Linear) and i < len(model) - 1:
            # every unit of the layer is the same, directly: one column repeated
            out = outs[i].astype(np.float64)
            assert np.ptp(out, axis=1).max() <= 1e-4 * np.abs(out).max()
            assert report.health.layer(str(i)).symmetric
    assert [r.call for r in report.health.remedies] == ["lk.init.kaiming_normal_"]


@pytest.mark.parametrize("case, verdict", [("dead", "dead-relu"), ("nan", "non-finite"),
                                           ("lora", "healthy")])
def test_other_verdicts_and_a_zero_branch_by_design(case, verdict, batch):
    x, y = batch
    rng = np.random.default_rng(0)
    first = lk.Linear(40, 32, rng=rng)
    if case == "dead":
        first.bias.data[:] = -10.0  # every pre-activation negative: every ReLU unit dead
    elif case == "nan":
        first.weight.data[0, 0] = np.nan
    else:  # LoRA's B starts at zero on purpose: its branch is not the signal
        first = lk.LoRALinear(first, rank=4)
    model = lk.Sequential(first, lk.ReLU(), lk.Linear(32, 10, rng=rng))
    report = doctor(model, x, y)
    assert report.verdict == verdict, report.health.summary
    if case == "nan":  # the layer types are still checked, on the library's finite cases
        assert all(g["ok"] for g in report.correctness["gradcheck"])


# ---------------------------------------------------------------------------- figures
def test_json_figures_equal_the_ledger_and_stats(trained, batch):
    x, y = batch
    report = doctor(trained, x, y)
    d = json.loads(report.json())
    led = lk.analysis.ledger(trained, x.shape)
    assert d["ledger"] == json.loads(json.dumps(led.to_dict()))
    assert d["questions"]["memory"] == led.memory and d["questions"]["totals"] == led.totals
    for row, r in zip(led.rows, d["questions"]["rows"], strict=True):
        assert (r["path"], r["type"], r["params"], r["trainable_params"], r["macs"], r["flops"],
                r["backward_flops"]) == (row.path, row.type, row.params, row.trainable_params,
                                         row.macs, row.flops, row.backward_flops)
        assert r["input_shape"] == list(row.input_shape)
        assert r["output_shape"] == list(row.output_shape)
        assert r["memory"]["activations"] == row.saved_bytes
    root = d["questions"]["rows"][0]["memory"]
    assert (root["weights"], root["grads"], root["optimizer"] + root["master"]) == (
        led.memory["weights"], led.memory["grads"], led.memory["optimizer"] + led.memory["master"])
    stats = record_stats(trained, x, y, lk.CrossEntropyLoss())
    layers = [h for h in d["health"]["layers"] if h["kind"] == "layer"]
    assert [s.name for s in stats.layers] == [h["path"] for h in layers]
    # the one other row is the Residual's output, which stats (leaves only) does not record
    blocks = [h for h in d["health"]["layers"] if h["kind"] == "block"]
    assert [(h["path"], h["type"]) for h in blocks] == [("2", "Residual")]
    branch = trained[2].module(trained[1](trained[0](x)))
    assert blocks[0]["std"] == pytest.approx(float(np.std(
        (trained[1](trained[0](x)) + branch).astype(np.float64))), rel=1e-5)
    for s, h in zip(stats.layers, layers):
        for key in ("mean", "std", "max_abs", "zero_fraction", "grad_out_norm"):
            assert h[key] == pytest.approx(getattr(s, key), rel=1e-9, abs=1e-12), key
        assert h["param_grad_norms"] == pytest.approx(s.param_grad_norms, rel=1e-9)
        assert h["param_norms"] == pytest.approx(s.param_norms, rel=1e-9)
    assert d["health"]["loss"] == pytest.approx(stats.losses[0] if stats.losses else
                                                report.health.loss)
    json.loads(report.json(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))


def test_per_layer_memory_sums_to_the_ledger_under_mixed_precision():
    model = lk.Sequential(lk.Linear(8, 16), lk.ReLU(), lk.Linear(16, 4)).to("bfloat16")
    model[2].weight.requires_grad = False  # frozen: no grad, no master, no state
    report = doctor(model, input_shape=(4, 8), optimizer="sgd-momentum")
    led = lk.analysis.ledger(model, (4, 8), optimizer="sgd-momentum")
    rows = report.questions["rows"]
    for key in ("weights", "grads", "master", "optimizer"):
        assert rows[0]["memory"][key] == led.memory[key]
        assert sum(r["memory"][key] for r in rows[1:]) == led.memory[key]


def test_a_finding_names_the_transform_call_and_command_that_remove_it(batch):
    x, _ = batch
    model = lk.Sequential(lk.Linear(40, 64), lk.Linear(64, 16), lk.ReLU(), lk.Linear(16, 10))
    report = doctor(model, x)
    merge = next(f for f in report.questions["findings"] if f["kind"] == "mergeable-linear")
    assert merge["call"] == "lk.transforms.merge_linear(model)"
    assert merge["cli"] == ("linearkit compress model.safetensors -o "
                            "model-mergeable-linear.safetensors --merge")
    merged = eval(merge["call"], {"lk": lk, "model": model})  # the exact call the report gives
    merged = merged[0] if isinstance(merged, tuple) else merged
    after = lk.analysis.ledger(merged, x.shape)
    assert report.ledger.totals["params"] - after.totals["params"] == merge["saving_params"]
    assert report.ledger.totals["flops"] - after.totals["flops"] == merge["saving_flops"]
    assert "apply: lk.transforms.merge_linear(model)" in report.text()


# ---------------------------------------------------------------------------- torch
def test_an_equivalent_torch_sequential_gives_the_same_three_answers(trained, batch):
    torch = pytest.importorskip("torch")
    from linearkit.io.torch import TorchResidual

    x, y = batch
    net = torch.nn.Sequential(torch.nn.Linear(40, 100), torch.nn.ReLU(),
                              TorchResidual(torch.nn.Sequential(torch.nn.Linear(100, 100),
                                                                torch.nn.ReLU())),
                              torch.nn.Linear(100, 10))
    net.load_state_dict({k: torch.from_numpy(np.array(v))
                         for k, v in trained.state_dict().items()})
    ours, theirs = doctor(trained, x, y), doctor(net, x, y)

    def answers(r):
        return [(q["path"], q["input_shape"], q["output_shape"], q["params"], q["flops"],
                 q["backward_flops"]) for q in r.questions["rows"]]

    assert answers(theirs) == answers(ours)
    assert theirs.model["source"] == "torch" and theirs.model["unread"] == []
    assert theirs.verdict == ours.verdict == "healthy"
    assert theirs.correctness["verify"]["ok"]  # the conversion, checked against the torch model


def test_a_torch_module_linearkit_cannot_read_is_named_and_the_rest_answered(batch):
    torch = pytest.importorskip("torch")

    class Doubler(torch.nn.Module):
        def forward(self, x):
            return 2 * x

    x, y = batch
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(), Doubler(),
                              torch.nn.Linear(64, 10))
    report = doctor(net, x, y)
    assert [(u["path"], u["type"]) for u in report.model["unread"]] == [("2", "Doubler")]
    assert report.model["pieces"] == ["0", "1", "3"]
    assert [h.path for h in report.health.layers] == ["0", "1", "3"]
    assert report.questions["rows"][3]["type"] == "Doubler"  # the ledger saw it, uncosted
    # the last Linear's gradient is the true one: torch's, through the Doubler
    net.zero_grad()
    out = net(torch.from_numpy(x))
    torch.nn.functional.cross_entropy(out, torch.from_numpy(y).long()).backward()
    assert report.health.layer("3").param_grad_norms["weight"] == pytest.approx(
        float(net[3].weight.grad.norm()), rel=1e-5)
    assert report.health.layer("0").param_grad_norms["weight"] == pytest.approx(
        float(net[0].weight.grad.norm()), rel=1e-5)
    assert "could not read" in report.text()


def test_a_torch_module_list_is_examined_child_by_child(batch):
    torch = pytest.importorskip("torch")

    class Loop(torch.nn.Module):  # never calls its ModuleList, only the layers in it
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([torch.nn.Linear(40, 32), torch.nn.Linear(32, 10)])

        def forward(self, x):
            return self.layers[1](torch.relu(self.layers[0](x)))

    x, y = batch
    torch.manual_seed(0)
    net = Loop()
    report = doctor(net, x, y)
    assert report.model["pieces"] == ["layers.0", "layers.1"]
    assert [u["path"] for u in report.model["unread"]] == [""]  # Loop's own forward only
    assert not any("no gradient reached" in note for note in report.notes)
    net.zero_grad()
    out = net(torch.from_numpy(x))
    torch.nn.functional.cross_entropy(out, torch.from_numpy(y).long()).backward()
    assert report.health.layer("layers.0").param_grad_norms["weight"] == pytest.approx(
        float(net.layers[0].weight.grad.norm()), rel=1e-5)


# ---------------------------------------------------------------------------- sections
def test_precision_readiness_reuses_range_check(trained, batch):
    x, y = batch
    report = doctor(trained, x, y, dtype="bfloat16")
    pr = report.precision
    rc = lk.analysis.range_check(trained, x, "bfloat16")
    assert [(r["path"], r["max_abs"], r["flag"]) for r in pr["rows"]] == [
        (r.path, r.max_abs, r.flag) for r in rc.rows]
    assert pr["ready"] and pr["first_problem"] is None
    assert not pr["loss_scaling"]["needed"]

    big = copy.deepcopy(trained)
    big[0].weight.data[:] = 3e4  # fine in float32, inf in float16 once summed
    risky = doctor(big, x, y, dtype="float16").precision
    assert risky["first_problem"]["path"] == "0" and risky["first_problem"]["flag"] == "overflow"
    assert not risky["ready"]


def test_float16_readiness_says_when_gradients_need_loss_scaling(batch):
    x, y = batch
    model = lk.Sequential(lk.Linear(40, 64, rng=np.random.default_rng(0)), lk.ReLU(),
                          lk.Linear(64, 10, rng=np.random.default_rng(1)))
    model[2].weight.data *= 1e-4  # gradients of the first layer ~1e-4 smaller: below 2^-14
    ls = doctor(model, x, y, dtype="float16").precision["loss_scaling"]
    assert ls["needed"] and ls["suggested_scale"] >= 2.0 ** 4
    assert ls["param_grads"]["subnormal"] > 0.01
    assert "lk.amp.GradScaler" in ls["why"]


def test_correctness_checks_each_layer_type_once_and_catches_a_transposed_square_weight(batch):
    torch = pytest.importorskip("torch")
    x, _ = batch
    model = lk.Sequential(lk.Linear(40, 40, rng=np.random.default_rng(0)), lk.ReLU(),
                          lk.Linear(40, 40, rng=np.random.default_rng(1)), lk.ReLU(),
                          lk.Linear(40, 10, rng=np.random.default_rng(2)))
    right = lk.io.to_torch(model)
    wrong = lk.io.to_torch(model)
    with torch.no_grad():
        wrong[0].weight.copy_(wrong[0].weight.T.clone())  # loaded in the (in, out) layout
    good = doctor(model, x, reference=right).correctness
    bad = doctor(model, x, reference=wrong).correctness
    assert good["verify"]["ok"] and good["verify"]["against"] == "a torch module"
    assert bad["verify"]["ok"] is False and bad["verify"]["mismatched"] > 0
    assert [g["type"] for g in good["gradcheck"]] == ["Sequential", "Linear", "ReLU"]
    assert all(g["ok"] for g in good["gradcheck"])
    with_callable = doctor(model, x, reference=lambda a: model(a)).correctness["verify"]
    assert with_callable["ok"] and with_callable["against"] == "a callable"


def test_runtime_reports_the_routes_and_the_blas_threads(trained, batch):
    x, y = batch
    rt = doctor(trained, x, y).runtime
    routes = lk.runtime.explain(trained, x).routes("vjp")
    assert [r["vjp"] for r in rt["pieces"][0]["routes"]] == routes
    assert rt["pieces"][0]["text"] == lk.runtime.explain(trained, x).text()
    assert rt["threads"] == lk.get_num_threads()


def test_the_model_and_the_library_generator_are_left_as_they_were(batch):
    x, y = batch
    model = lk.Sequential(lk.Linear(40, 32), lk.BatchNorm1d(32), lk.ReLU(), lk.Dropout(0.2),
                          lk.Linear(32, 10))
    model[0].weight.grad = np.full_like(model[0].weight.data, 0.5)
    before = {k: np.array(v, copy=True) for k, v in model.state_dict().items()}
    state = lk.core.random.default_generator().bit_generator.state
    report = doctor(model, x, y, dtype="float16")
    assert report.health.layers and report.correctness["gradcheck"]
    after = model.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert np.all(model[0].weight.grad == 0.5) and model[4].weight.grad is None
    assert lk.core.random.default_generator().bit_generator.state == state
    assert model.training


def test_without_x_a_random_probe_is_used_and_said(trained):
    report = doctor(trained)
    assert report.probe["kind"] == "random" and report.probe["shape"] == [64, 40]
    assert report.probe["targets"]["kind"] == "random"
    assert "random probe" in report.text()
    shaped = doctor(trained, input_shape=(8, 40))
    assert shaped.probe["shape"] == [8, 40] and shaped.health.layers[0].shape == (8, 100)


# ---------------------------------------------------------------------------- HTML
class _Page(HTMLParser):
    """Collects every src/href and the PNG data URIs of a page."""

    def __init__(self):
        super().__init__()
        self.links, self.pngs = [], []

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name in ("src", "href"):
                self.links.append(value)
                if tag == "img" and value.startswith("data:image/png;base64,"):
                    self.pngs.append(base64.b64decode(value.split(",", 1)[1]))


def test_html_is_one_self_contained_file_with_embedded_png_plots(trained, batch, tmp_path):
    pytest.importorskip("matplotlib")
    x, y = batch
    path = tmp_path / "doctor.html"
    page = doctor(trained, x, y, dtype="bfloat16").html(path)
    assert path.read_text(encoding="utf-8") == page
    assert '<img src="data:image/png;base64,' in page
    parser = _Page()
    parser.feed(page)
    assert len(parser.pngs) == 2 and all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in parser.pngs)
    assert all(link.startswith("data:") for link in parser.links)  # nothing to fetch
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert "Verdict: healthy" in page and "Precision readiness" in page


def test_html_without_matplotlib_has_tables_only_and_says_so(trained, batch, monkeypatch):
    x, y = batch
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    page = doctor(trained, x, y).html()
    assert "data:image/png" not in page and "tables only" in page and "<table>" in page


def test_html_renders_in_a_headless_browser(trained, batch, tmp_path):
    browser = (shutil.which("chromium") or shutil.which("chromium-browser")
               or shutil.which("google-chrome"))
    if browser is None:
        pytest.skip("no headless browser on PATH (chromium, chromium-browser, google-chrome): "
                    "the page's structure is checked above, its rendering is not")
    mpimg = pytest.importorskip("matplotlib.image")
    x, y = batch
    page, shot = tmp_path / "doctor.html", tmp_path / "shot.png"
    doctor(trained, x, y).html(page)
    subprocess.run([browser, "--headless", "--disable-gpu", "--no-sandbox",
                    f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri()],
                   capture_output=True, timeout=120, check=False)
    assert shot.is_file(), "the browser wrote no screenshot"
    pixels = mpimg.imread(str(shot))
    assert pixels.std() > 0.01  # not one blank colour


# ---------------------------------------------------------------------------- CLI entry point
def _args(**kw):
    base = {"file": None, "arch": None, "torch": None, "data": None, "input_shape": None,
            "precision": None, "json": False, "html": None}
    base.update(kw)
    return argparse.Namespace(**base)


def test_run_reads_a_model_file_and_mnist1d(trained, tmp_path, capsys):
    pytest.importorskip("safetensors")
    path = tmp_path / "mnist1d-mlp.safetensors"
    lk.save(trained, path)
    html = tmp_path / "report.html"
    assert run(_args(file=str(path), data="mnist1d", precision="bfloat16", json=True,
                     html=str(html))) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"]["name"] == "mnist1d-mlp.safetensors" and d["probe"]["shape"] == [100, 40]
    assert d["verdict"] == "healthy" and d["precision"]["dtype"] == "bfloat16"
    assert html.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


def test_run_reads_a_torch_module_and_npy_data(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    (tmp_path / "doctor_test_net.py").write_text(
        "import torch\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(40, 16), torch.nn.ReLU(),\n"
        "                               torch.nn.Linear(16, 10))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.standard_normal((20, 40)).astype(np.float32))
    np.save(tmp_path / "y.npy", rng.integers(0, 10, 20))
    data = f"{tmp_path / 'x.npy'},{tmp_path / 'y.npy'}"
    assert run(_args(torch="doctor_test_net:build", data=data)) == 0
    out = capsys.readouterr().out
    assert out.startswith("linearkit doctor: Sequential (torch)")
    assert "your batch x (20, 40)" in out and "5. RUNTIME" in out


@pytest.mark.parametrize("kw, message", [
    ({}, "exactly one"),
    ({"file": "a.safetensors", "torch": "m:a"}, "exactly one"),
    ({"file": "/no/such/model.safetensors"}, "no such file"),
    ({"torch": "no_colon"}, "MODULE:ATTR"),
    ({"torch": "json:loads"}, "no arguments"),
    ({"torch": "json:JSONDecodeError.__name__"}, "not a torch.nn.Module"),
])
def test_run_refuses_bad_arguments_in_one_line(kw, message):
    with pytest.raises(DoctorUsageError, match=message) as err:
        run(_args(**kw))
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------- packaging, docs, time
def test_import_linearkit_does_not_import_the_doctor():
    code = ("import sys, linearkit as lk; lk.analysis.ledger; "
            "print('linearkit.analysis.doctor' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.strip() == "False"


def test_the_walkthrough_in_docs_doctor_md_runs(tmp_path, monkeypatch):
    text = DOC.read_text(encoding="utf-8")
    blocks = [b.split("```", 1)[0] for b in text.split("```python\n")[1:]]
    assert len(blocks) >= 3
    monkeypatch.chdir(tmp_path)  # it writes doctor.html
    namespace: dict = {}
    for i, block in enumerate(blocks, 1):  # in order, in one session, as a reader runs them
        exec(compile(block, f"docs/doctor.md, python block {i}", "exec"), namespace)


def test_the_whole_report_on_the_readme_model_takes_well_under_5_s(trained, batch, tmp_path):
    x, y = batch
    start = time.perf_counter()
    report = doctor(trained, x, y, dtype="bfloat16")
    report.text(), report.json(), report.html(tmp_path / "r.html")
    seconds = time.perf_counter() - start
    assert seconds < 5.0, f"the whole report took {seconds:.2f} s"
