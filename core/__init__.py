"""The simulated serving engine: block pool, sequences, KV cache, token model, engine.

``core`` never imports Qt. Operations go in, immutable events come out.
"""

from pagesim.core import compiled_core

# The step path's compiled modules stand in for their sources when built from exactly them.
compiled_core.load(__path__)
