"""What linearkit asks of the machine: BLAS threads and the CPU-load sampling that picks them,
subnormal-float flushing, the BLAS binding and the numba kernels (``backend.fast``). Imports
nothing else of linearkit, so every floor above may use it."""
