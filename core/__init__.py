"""The simulated serving engine: block pool, sequences, KV cache, token model, engine.

``core`` never imports Qt. Operations go in, immutable events come out.
"""
