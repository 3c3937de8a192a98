"""The flags of one layer of a compiled chain (backend/fast/chain_kernel.py; plan in runtime/compiled_chain.py).

A layer's flag is a sum of these bits. Kept apart from the kernel (with the workspace's size)
so that planning a chain imports no numba.
"""

BIAS, RELU, RES_START, RES_END = 1, 2, 4, 8       # structure: bias, ReLU after, Residual bounds
NEED_DW, NEED_DB, NEED_DX = 16, 32, 64            # what the backward computes for the layer
WEIGHT_FIRST = 128     # the forward GEMM as (W @ x.T).T (gemm.forward_layout says when)
BIAS_FIRST = 256       # the bias written first, the GEMM adding into it (gemm.forward_layout)


def workspace_per_row(outs, flags) -> int:
    """Elements of the chain's workspace per row of its input, for layers of ``outs`` output
    features: each unit's output and each residual's sum, except the chain's final output
    (which goes to ``out``, unless a residual's sum follows it)."""
    size = 0
    last = len(outs) - 1
    for i, (n, f) in enumerate(zip(outs, flags)):
        if i != last or f & RES_END:      # z_i
            size += n
        if f & RES_END and i != last:     # the residual's sum
            size += n
    return size
