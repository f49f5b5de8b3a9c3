"""Paged-attention kernels and the backends that launch them.

``kernels`` knows nothing about the simulator: it takes a physical KV cache, block
tables and context lengths, exactly as a serving engine hands them to its kernel.

The interface is ``kernels.backend``; the choice of backend is ``kernels.selection``.
This package imports nothing itself, so importing the interface never loads a backend.
"""
