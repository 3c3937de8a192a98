"""What is measured: shapes, model sizes, step counts and repeat counts, shared by every worker.

Kept free of heavy imports so that the parent and every worker read the same definitions.
"""

from __future__ import annotations

import itertools
import math

# Groups in run order, and the frameworks each one is written for.
GROUPS: dict[str, tuple[str, ...]] = {
    "large": ("numpy", "linearkit", "torch", "jax"),
    "precision": ("linearkit",),
    "small": ("numpy", "linearkit", "torch", "jax"),
    "batch1": ("numpy", "linearkit", "torch"),
    "mlp": ("numpy", "linearkit", "torch", "jax"),
    "recipe": ("numpy", "linearkit", "torch", "jax"),
    "e2e": ("linearkit", "torch", "jax"),
    "sweep": ("linearkit", "torch"),
    "busy": ("numpy", "linearkit", "torch"),
    "footprint": ("linearkit",),
    "memory": ("linearkit",),
    "profile": ("linearkit",),
}
GROUP_HELP = {
    "large": "Linear forward and forward+backward at batch 256/1024 and (64, 128, 1024) -> 4096",
    "precision": "Linear 1024 -> 4096 at batch 256/1024 stored in bfloat16 / float16 (float32 "
                 "compute) vs float32, interleaved in one process; blocked vs whole upcast",
    "small": "Linear(16, 16) on one sample: forward, forward+backward (us per call)",
    "batch1": "backward of a batch-1 Linear (the K=1 dW product) vs PyTorch",
    "mlp": "784-256-256-10 ReLU MLP: Adam training at batch 32/128/512 (PyTorch's fused Adam "
           "also on 1 thread), each framework's step's 8 GEMMs back to back, inference at 1/256",
    "recipe": "the `linearkit train` recipe: 40-100-res(100)-10 MLP, Adam lr 1e-2, batch 100; "
              "each framework's step's 8 GEMMs back to back",
    "e2e": "the recipe end to end in a fresh process: `linearkit train` with numba's kernel "
           "cache filled (warm) and empty (cold) vs the same recipe as a PyTorch / JAX script, "
           "start-up, data, evaluation and saving included",
    "sweep": "Linear(1024, 1024) float32 against batch 1..64 (the knee) and widths 250/256, "
             "1000/1024, 4000/4096 at batch 64, under the default thread policy and at 1 and "
             "2 BLAS threads (linearkit.analysis.layer_sweep); PyTorch on the same sweep",
    "busy": "the recipe step, the README's step and the MLP at batch 128, idle and with one "
            "process spinning on a core; BLAS-thread variants; GEMMs at 1 and 2 threads",
    "footprint": "`import linearkit`: time and peak RSS in a fresh interpreter",
    "memory": "tracemalloc over 1,000 training steps: growth, per-step peak, gradient reuse",
    "profile": "cProfile of a linearkit training step + per-call overheads of the protocol",
}
# Groups whose numbers depend on the BLAS kernel: rerun under --forced-kernel.
BLAS_GROUPS = ("large", "precision", "small", "batch1", "mlp", "recipe")
BLAS_FRAMEWORKS = ("numpy", "linearkit")
# Groups whose frameworks' repeats are taken in turn, one process each (benchmarks/paired.py):
# every case of theirs is a ratio target, and a ratio of two medians taken minutes apart on this
# machine measures its drift as much as the frameworks.
PAIRED_GROUPS = ("large", "small", "batch1", "mlp", "recipe")

LARGE = [((256, 1024), 4096), ((1024, 1024), 4096), ((64, 128, 1024), 4096)]
PRECISION = LARGE[:2]  # the shapes of the 16-bit targets (16-bit storage vs float32)
# its targets: a 16-bit-stored layer's time over float32's, forward+backward
PRECISION_LIMITS = {"bfloat16": 1.3, "float16": 1.6}
SMALL = ((1, 16), 16)
BATCH1 = [(1024, 1024), (1024, 4096)]  # (in_features, out_features), x of shape (1, in)
MLP_SIZES = (784, 256, 256, 10)
MLP_TRAIN_BATCHES = (32, 128, 512)
MLP_INFER_BATCHES = (1, 256)
MLP_LR = 1e-3
# The MLP training targets, per batch: linearkit's samples/s over PyTorch fused Adam's (the faster
# of its default thread count and one thread: TORCH_FUSED) and over JAX jit's; at MLP_GEMM_BATCH
# the step within MLP_GEMM_LIMIT of its own 8 GEMMs back to back.
MLP_VS_TORCH_FUSED = {32: 1.5, 128: 1.15, 512: 1.1}
MLP_VS_JAX = {32: 1.1, 128: 0.95, 512: 0.9}
# The third round's floors (R3): the MLP step against PyTorch fused Adam and JAX jit at every
# batch, and the first `linearkit train` (an empty kernel cache) against a warm one.
R3_MLP_VS_TORCH_FUSED = 1.1
R3_MLP_VS_JAX = 1.0
R3_COLD_OVER_WARM = 1.5
MLP_GEMM_BATCH = 512
MLP_GEMM_LIMIT = 1.15
RECIPE = {"n_train": 4000, "in": 40, "hidden": 100, "classes": 10, "batch": 100, "lr": 1e-2}
RECIPE_SIZES = (RECIPE["in"], RECIPE["hidden"], RECIPE["hidden"], RECIPE["classes"])
# "PyTorch fused Adam" in the MLP targets and in the host/library split (docs/performance.md, 4c):
# the faster of these two cases, each with the step's GEMMs at its own thread count; the
# second is measured only where torch's default thread count is above one.
TORCH_FUSED = (("train-fused", "gemms"), ("train-fused-1thread", "gemms-1thread"))
# The training steps whose ratios are split into the host's part (the GEMMs) and the library's:
# (group, batch, layer sizes); the case of a step at batch B is "train:B" in the mlp group and
# "train" in the recipe group, its GEMMs' "gemms:B" / "gemms".
GEMM_STEPS = ([("mlp", b, MLP_SIZES) for b in MLP_TRAIN_BATCHES] +
              [("recipe", RECIPE["batch"], RECIPE_SIZES)])
# The recipe targets: per step, PyTorch eager's time over linearkit's, JAX jit's over ours.
RECIPE_VS_TORCH = 4.0
RECIPE_VS_JAX = 1.2
# The small-call targets: linearkit's Linear(16, 16) time over bare NumPy's, same run.
SMALL_LIMITS = {"fwd": 1.5, "fwdbwd": 1.6}
# The busy-machine group: three training steps, each idle and beside one spinning process.
BUSY_STEPS = {
    "recipe": "the recipe step: 40-100-res(100)-10, batch 100, Adam lr 1e-2, batches gathered "
              "from the 4,000-row set",
    "readme": "README's \"A training step\": the same model on its one fixed batch "
              "(x (100, 40) standard normal, target arange(100) % 10)",
    "mlp128": "784-256-256-10 ReLU MLP at batch 128, Adam lr 1e-3",
}
# Forward GEMMs x (M, K) @ W.T (K, N) at 1 and 2 BLAS threads, idle and busy: the evidence
# for linearkit.backend.threads.SMALL_GEMM_MACS. The first four are the three steps' own sizes.
BUSY_GEMMS = [(100, 40, 100), (100, 100, 100), (128, 256, 256), (128, 784, 256),
              (512, 784, 256)]
N_BATCHES = 8  # distinct synthetic batches cycled through by the MLP throughput cases
# The sweep group (docs/sweep.md): one layer against batch size, and square widths just under
# and at a multiple of 8/16/64, at one batch.
SWEEP_LAYER = (1024, 1024)
SWEEP_MAX_BATCH = 64
SWEEP_DIMS = (250, 256, 1000, 1024, 4000, 4096)
SWEEP_DIM_BATCH = 64
SWEEP_THREADS = (None, 1, 2)  # None: linearkit's default policy (linearkit.backend.threads)
# The large-layer target holds "in three consecutive runs": the large group runs at least this
# many rounds for NumPy and linearkit (more with --rounds), each round's ratio reported.
LARGE_ROUNDS = 3
# No growth of traced memory over this many training steps (a target), at most this much in all.
MEMORY_STEPS = 1000
MEMORY_GROWTH_LIMIT = 16 * 1024


def config(quick: bool | str) -> dict:
    """Repeat counts and sizes: ``quick`` trades precision for a ~2 minute run; ``"smoke"``
    (``--smoke``) runs every case once or twice, to test the harness itself, not to measure."""
    if quick == "smoke":
        return {"quick": "smoke", "repeats": 1, "min_time": 0.001, "train_min_time": 0.001,
                "recipe_steps": 30, "recipe_repeats": 1, "import_repeats": 1,
                "profile_steps": 20, "busy_rounds": 1, "memory_steps": 20, "e2e_repeats": 1,
                "sweep_repeats": 1, "large_rounds": 1}
    if quick:
        return {"quick": True, "repeats": 3, "min_time": 0.06, "train_min_time": 0.12,
                "recipe_steps": 1000, "recipe_repeats": 3, "import_repeats": 3,
                "profile_steps": 300, "busy_rounds": 1, "memory_steps": MEMORY_STEPS,
                "e2e_repeats": 1, "sweep_repeats": 5, "large_rounds": 1}
    return {"quick": False, "repeats": 7, "min_time": 0.2, "train_min_time": 0.3,
            "recipe_steps": 6000, "recipe_repeats": 5, "import_repeats": 7,
            "profile_steps": 1500, "busy_rounds": 2, "memory_steps": MEMORY_STEPS,
            "e2e_repeats": 3, "sweep_repeats": 15, "large_rounds": LARGE_ROUNDS}


def step_gemms(sizes, batch: int) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
    """The GEMMs of one training step of the chain of Linear layers ``sizes`` at ``batch``, in
    the order a step runs them: ``(name, (M, K), (K, N))``.

    Per layer ``i`` of shape (out, in): the forward ``x @ W.T`` (B, in) x (in, out), then, from
    the last layer down, ``dW = dy.T @ x`` (out, B) x (B, in) and ``dx = dy @ W`` (B, out) x
    (out, in), less the first layer's ``dx`` (nothing needs the input's gradient). A residual
    block adds elementwise work, no GEMM. Three layers: 8 GEMMs.
    """
    layers = list(itertools.pairwise(sizes))
    out = [(f"x{i}@W{i}.T", (batch, d_in), (d_in, d_out))
           for i, (d_in, d_out) in enumerate(layers, 1)]
    for i in range(len(layers), 0, -1):
        d_in, d_out = layers[i - 1]
        out.append((f"dW{i}=dy{i}.T@x{i}", (d_out, batch), (batch, d_in)))
        if i > 1:
            out.append((f"dx{i}=dy{i}@W{i}", (batch, d_out), (d_out, d_in)))
    return out


def gemm_flops(sizes, batch: int) -> float:
    """2·M·K·N summed over :func:`step_gemms`."""
    return 2.0 * sum(m * k * n for _, (m, k), (_, n) in step_gemms(sizes, batch))


def shape_name(shape) -> str:
    return "x".join(str(d) for d in shape)


def large_id(kind: str, x_shape, out_features: int) -> str:
    return f"{kind}:{shape_name(x_shape)}->{out_features}"


def linear_flops(x_shape, out_features: int, backward: bool) -> float:
    """2·M·K·N for the forward GEMM; the backward adds dX and dW, twice as much again."""
    m = math.prod(x_shape[:-1])
    k = x_shape[-1]
    gemms = 3 if backward else 1
    return 2.0 * m * k * out_features * gemms
