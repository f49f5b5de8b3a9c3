"""Regenerate assets/scenarios/stress.toml: a seeded stream of operations that keeps a
small pool close to exhaustion. Proposals the engine refuses are replaced by a free,
so every shipped step is valid. Usage: python scripts/make_stress_scenario.py"""

import random
from pathlib import Path

from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import PagesimError
from pagesim.core.operations import Add, Fork, Free, Grow
from pagesim.core.scenario import Scenario
from pagesim.kernels.cpu_backend import CpuBackend

STEPS = 240
config = CacheConfig(num_blocks=256, block_size=16, num_heads=8, num_kv_heads=2, head_dim=64, dtype="float16", seed=11)
sim = Simulator(config, CpuBackend())
rng = random.Random(2026)
ops, serial = [], 0
while len(ops) < STEPS:
    live = list(sim.sequences)
    r = rng.random()
    if not live or (r < 0.2 and len(live) < 40):
        serial += 1
        op = Add(f"r{serial}", rng.randint(20, 300))
    elif r < 0.3:
        serial += 1
        op = Fork(rng.choice(live), f"r{serial}")
    elif r < 0.38:
        op = Free(rng.choice(live))
    else:
        op = Grow(rng.choice(live), rng.choice([1, 1, 1, 4, 16, 33]))
    try:
        sim.apply(op, attend=False)
    except PagesimError:
        if not live:
            continue
        op = Free(rng.choice(live))
        sim.apply(op, attend=False)
    ops.append(op)

scenario = Scenario(
    name="Stress: a pool under pressure",
    description=(
        "240 seeded arrivals, decodes, forks and frees on a 256-block pool of 16 slots that runs close to "
        "exhaustion: whenever a request would not fit, another sequence is freed to make room. Half-precision "
        "(float16) storage, 8 query heads over 2 KV heads (GQA 4:1), head dim 64."
    ),
    config=config,
    operations=tuple(ops),
)
path = Path(__file__).resolve().parent.parent / "assets" / "scenarios" / "stress.toml"
path.write_text(scenario.to_toml(), encoding="utf-8")
print(f"wrote {path}: {len(ops)} steps, min free blocks along the way: see pagesim run")
