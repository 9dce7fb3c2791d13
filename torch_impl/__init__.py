"""The same mechanisms with PyTorch's native API, on CPU or CUDA.

Each module points to its twin in `reference/` for the math and states only what PyTorch
does differently or hides. It may import `reference` for plain data specs (a format's bit
widths), never to borrow an algorithm, and never imports `parity`.
"""
