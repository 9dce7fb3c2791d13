"""The reference implementation: every mechanism from first principles in NumPy.

Pure NumPy (plus the standard library): this package never imports torch, torch_impl or
parity. Read a module top to bottom; its docstring states the math.
"""
