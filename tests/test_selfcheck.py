"""`linearkit gradcheck` runs the conformance case table: every shipped module and loss."""

from linearkit import functional as F
from linearkit import losses
from linearkit.analysis.cases import LOSS_CASES, MODULE_CASES
from linearkit.analysis.selfcheck import self_check


def test_every_module_case_and_every_loss_is_checked():
    lines = []
    passed, failed = self_check(lines.append)
    assert (passed, failed) == (len(MODULE_CASES) + len(LOSS_CASES), 0)
    checked = {line.split()[1] for line in lines[:-1]}
    assert checked == {c.id for c in MODULE_CASES} | {c.id for c in LOSS_CASES}
    for required in ("Identity", "LazyLinear", "Dropout-p0-train", "Dropout-eval"):
        assert required in checked
    shipped_losses = {name for name in losses.__all__ if name.endswith("Loss")}
    assert shipped_losses <= {c.id.split("-")[0] for c in LOSS_CASES}


def test_a_wrong_backward_is_reported(monkeypatch):
    monkeypatch.setattr(F, "tanh_backward", lambda dy, y: dy * (1 - y))  # should be 1 - y**2
    lines = []
    _, failed = self_check(lines.append)
    assert failed >= 1
    assert any(line.startswith("FAIL Tanh ") for line in lines)


def test_the_case_table_never_imports_torch():
    import subprocess
    import sys

    code = ("import sys, linearkit.analysis.cases, linearkit.analysis.selfcheck; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
