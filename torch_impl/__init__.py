"""The same mechanisms with PyTorch's native API, on CPU or CUDA.

Each module points to its twin in `reference/` for the math and states only what PyTorch
does differently or hides. It imports no `reference` module at all: what both trees share
literally (a format's bit widths, a configuration, a plan's shape, the loop around the step)
is in `common/`, and it never imports `parity`.
"""
