"""The flags of one layer of a compiled chain (fast/chain_kernel.py; plan in layers/compiled.py).

A layer's flag is a sum of these bits. Kept apart from the kernel so that planning a chain
imports no numba.
"""

BIAS, RELU, RES_START, RES_END = 1, 2, 4, 8       # structure: bias, ReLU after, Residual bounds
NEED_DW, NEED_DB, NEED_DX = 16, 32, 64            # what the backward computes for the layer
