"""Which part of a training step's ratio is the host's and which the library's (docs/performance.md,
4c and 4d).

A step of the MLP or of the recipe spends part of its time in its own GEMMs (``cases.step_gemms``)
and the rest in the framework: activations, the loss, Adam, dispatch. Each framework's process
also times those GEMMs alone, back to back, at the thread count of its step (``gemms`` cases):
NumPy and linearkit on NumPy's OpenBLAS, PyTorch on the BLAS it was built with, JAX on XLA. Then

    their step / linearkit's step = (their GEMMs / linearkit's GEMMs) × (library part)

where the first factor is the host's (how fast each framework's BLAS runs these shapes on this
machine) and the library part is the ratio of the two overhead factors, step / its own GEMMs.
A host whose BLAS favours one framework moves the first factor, not the second.
"""

from __future__ import annotations

from . import cases
from .report import (
    FW_NAMES,
    View,
    _ok,
    _section,
    case_name,
    div,
    num,
    per_step,
    ratio,
    step_ratio,
    torch_fused,
)

FRAMEWORKS = ("numpy", "linearkit", "torch", "jax")


def step_label(group: str, batch: int) -> str:
    return (f"MLP 784-256-256-10, batch {batch}" if group == "mlp"
            else f"recipe 40-100-res(100)-10, batch {batch}")


def step_cases(v: View, group: str, batch: int) -> dict[str, tuple[str, str]]:
    """Per framework, ``(step case, its GEMMs' case)``: PyTorch's the faster fused Adam's."""
    out = {fw: (case_name(group, "train", batch), case_name(group, "gemms", batch))
           for fw in FRAMEWORKS}
    fused = torch_fused(v, group, batch)
    out["torch"] = (fused.step, fused.gemms)
    return out


def overhead(v: View, group: str, fw: str, cases_: tuple[str, str]) -> float | None:
    """``fw``'s step time over its own GEMMs' (paired repeats, one process)."""
    step, gemms = cases_
    return step_ratio(v, group, (fw, step), (fw, gemms))


def split(v: View, group: str, batch: int, fw: str) -> dict:
    """``fw``'s step against linearkit's: ``step`` (time ratio, above 1: linearkit faster),
    ``host`` (their GEMMs' time over linearkit's), ``library`` (step / host) and both
    overhead factors."""
    c = step_cases(v, group, batch)
    step = step_ratio(v, group, (fw, c[fw][0]), ("linearkit", c["linearkit"][0]))
    host = step_ratio(v, group, (fw, c[fw][1]), ("linearkit", c["linearkit"][1]))
    return {"step": step, "host": host, "library": div(step, host),
            "theirs": overhead(v, group, fw, c[fw]),
            "ours": overhead(v, group, "linearkit", c["linearkit"])}


def _steps(v: View) -> list[tuple[str, int, tuple]]:
    return [(g, b, sizes) for g, b, sizes in cases.GEMM_STEPS if v.has(g)]


def _gemm_cell(v: View, group: str, fw: str, case: str, flops: float) -> str:
    t = per_step(v.get(group, fw, case))
    return f"{num(t and 1e6 * t)} ({num(div(flops / 1e9, t))})" if _ok(t) else "n/a"


def blas_words(v: View) -> dict[str, str]:
    """Each framework's GEMM library as its worker reported it."""
    blas = [lib for lib in v.info.get("blas", []) if "error" not in lib]
    openblas = (f"{blas[0].get('internal_api')} {blas[0].get('version')} "
                f"({blas[0].get('architecture')}, {blas[0].get('num_threads')} threads)"
                if blas else "NumPy's BLAS")
    info = {fw: next(((v.worker(g, fw) or {}).get("info") or {} for g, _, _ in _steps(v)
                      if (v.worker(g, fw) or {}).get("info")), {}) for fw in ("torch", "jax")}
    torch_blas = info["torch"].get("blas")
    return {"numpy": f"NumPy's {openblas} at its default threads",
            "linearkit": f"the same {openblas} through `linearkit.functional` under linearkit's "
                         "BLAS-thread policy, as its step runs them",
            "torch": (f"`torch.mm(..., out=)` on torch's {torch_blas or 'BLAS'} "
                      f"(its build's BLAS_INFO) at the thread count of its faster fused-Adam step"),
            "jax": (f"XLA (jaxlib {info['jax'].get('jaxlib', '?')}), one jitted call of the "
                    "GEMMs, `dz` donated and handed back so that each call waits for the one "
                    "before, as the step's donated parameters make it")}


def _shapes(sizes) -> str:
    return ", ".join(f"{name} ({m}×{k})·({k}×{n})"
                     for name, (m, k), (_, n) in cases.step_gemms(sizes, "B"))


def gemms_section(v: View):
    rows = []
    for group, batch, sizes in _steps(v):
        c = step_cases(v, group, batch)
        flops = cases.gemm_flops(sizes, batch)
        rows.append([step_label(group, batch), num(flops / 1e6, 1)] +
                    [_gemm_cell(v, group, fw, c[fw][1], flops) for fw in FRAMEWORKS] +
                    [ratio(overhead(v, group, fw, c[fw])) for fw in FRAMEWORKS] +
                    [torch_fused(v, group, batch).words])
    words = blas_words(v)
    return _section(
        "4c. Each step's own GEMMs alone, per framework (µs per step's GEMMs, GFLOP/s in "
        "parentheses; overhead factor = step / its GEMMs)",
        ["step", "GEMM MFLOP", "GEMMs: NumPy", "GEMMs: linearkit", "GEMMs: PyTorch",
         "GEMMs: JAX", "overhead: NumPy", "overhead: linearkit", "overhead: PyTorch fused",
         "overhead: JAX", "PyTorch threads"], rows,
        "Only the GEMMs of one training step, back to back, in the framework's own process and "
        "at the thread count of its step (repeats taken in turn with the steps'): for each "
        "Linear (out, in) at batch B the forward x@W.T (B×in)·(in×out), dW = dy.T@x "
        "(out×B)·(B×in) and dx = dy@W (B×out)·(out×in), less the first layer's dx, on the "
        "input batches the steps cycle through. MLP: " + _shapes(cases.MLP_SIZES) +
        "; the recipe: " + _shapes(cases.RECIPE_SIZES) + " (its residual adds no GEMM). "
        f"NumPy: {words['numpy']}; linearkit: {words['linearkit']}; PyTorch: {words['torch']}; "
        f"JAX: {words['jax']}. The *overhead factor* is the framework's step time over its "
        "GEMMs' time: what the framework adds around the arithmetic that every framework must "
        "do (activations, the loss, Adam, dispatch, allocation); linearkit's at batch "
        f"{cases.MLP_GEMM_BATCH} is a target (≤ {cases.MLP_GEMM_LIMIT}×). PyTorch's step: fused "
        "Adam (4a); the recipe's steps are those of section 5 (the documented step loop).")


def ratios_section(v: View):
    rows = []
    for group, batch, _ in _steps(v):
        for fw, label in (("torch", "PyTorch fused Adam"), ("jax", "JAX jit"),
                          ("numpy", "NumPy")):
            r = split(v, group, batch, fw)
            rows.append([step_label(group, batch), label, ratio(r["step"]), ratio(r["host"]),
                         ratio(r["library"]), ratio(r["theirs"]), ratio(r["ours"])])
    return _section(
        "4d. Each step ratio split: the host's GEMMs × the library's overhead",
        ["step", "against", "step: theirs / linearkit's", "host: their GEMMs / linearkit's",
         "library: step ratio / host ratio", "their overhead factor",
         "linearkit's overhead factor"], rows,
        "Times over linearkit's (above 1: linearkit faster). *host* is the ratio of the two "
        "frameworks' GEMMs alone on these shapes (4c): what this machine's BLAS builds and "
        "thread counts give each framework before any library code runs. *library* is the step "
        "ratio divided by it, the ratio of the two overhead factors: the part of the step "
        "ratio that is the libraries' own. On another machine (another BLAS, another CPU) the "
        "host column moves; the library column says how linearkit's overhead over its GEMMs "
        "compares with the other's. Each ratio is the median of the ratios of repeats taken in "
        "turn; step = host × library by definition, while the two overhead factors, each its "
        "own median, give the library column only up to how the medians fall (on a busy "
        "machine, not closely). PyTorch: fused Adam, "
        "its faster thread count (4a); NumPy shares linearkit's BLAS, so its host column is "
        f"the thread policy's part. The {FW_NAMES['jax']} step and GEMMs run at XLA's default "
        "thread count.")


def sections(v: View) -> list[dict]:
    if not _steps(v):
        return []
    return [gemms_section(v), ratios_section(v)]
