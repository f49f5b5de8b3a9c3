"""Random operations of every kind — add (synthetic, shared-prefix, placed), grow (counts
and explicit ids), fork, free, submit (samples, beams), schedule (preemption by recompute
or swap), timeline seeks back and forth — checking the invariants after every one, under
the v0 scheduler and under v1 (chunked prompts beside the user's own sequences).

Planted mutations this catches (``test_planted_pool_mutations_are_caught`` below keeps
two of them honest): a prefix-cache hit that forgets to take its block off the free count
(the free queue's length and the free count disagree); a cached-free counter that is never
decremented (it disagrees with a recount); a refused operation that changes anything (the
fingerprint, KV bytes included); a seek that does not restore the exact state; the
kernel and dense attention drifting apart.
"""

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from pagesim.core.blocks import BlockPool
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import PagesimError
from pagesim.core.operations import Add, Fork, Free, Grow, Schedule, Submit
from pagesim.core.scenario import Scenario
from pagesim.core.timeline import Timeline
from pagesim.kernels.cpu_backend import CpuBackend

from tests.core.helpers import check_invariants, state_fingerprint
from tests.core.test_scheduler import check_cpu_pool
from tests.on_the_sources import on_the_sources

NAMES = st.sampled_from([f"s{i}" for i in range(8)])
BACKEND = CpuBackend()


class EngineMachine(RuleBasedStateMachine):
    @initialize(
        block_size=st.sampled_from([1, 3, 4]),
        dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
        prefix_caching=st.booleans(),
        preemption=st.sampled_from(["recompute", "swap"]),
        watermark=st.sampled_from([0.0, 0.1]),
    )
    def start(self, block_size, dtype, prefix_caching, preemption, watermark):
        self.begin(
            block_size=block_size,
            dtype=dtype,
            prefix_caching=prefix_caching,
            preemption=preemption,
            num_cpu_blocks=16,
            watermark=watermark,
        )

    def begin(self, **settings) -> None:
        """A timeline over a 12-block pool of two-head, 8-wide K/V with these settings."""
        config = CacheConfig(num_blocks=12, num_heads=2, num_kv_heads=1, head_dim=8, max_num_seqs=6, **settings)
        self.timeline = Timeline(Scenario("random", "", config, ()), BACKEND, snapshot_every=4)
        self.requests = 0

    @property
    def sim(self):
        return self.timeline.sim

    def _try(self, op):
        before = state_fingerprint(self.sim)
        try:
            result = self.timeline.push(op)
        except PagesimError:
            assert state_fingerprint(self.sim) == before, f"refused {op} changed state"
            return
        if result.attention is not None:
            assert result.attention.passed, f"kernel != dense after {op}"

    @rule(seq=NAMES, tokens=st.integers(1, 14))
    def add(self, seq, tokens):
        self._try(Add(seq, tokens))

    @rule(
        seq=NAMES, prefix=st.sampled_from([(7, 8, 9, 10, 11, 12), (7, 8, 9, 1, 2, 3), (5,)]), suffix=st.integers(0, 5)
    )
    def add_shared_prefix(self, seq, prefix, suffix):
        self._try(Add(seq, prompt=(*prefix, *range(300, 300 + suffix))))

    @rule(seq=NAMES, blocks=st.lists(st.integers(0, 11), min_size=1, max_size=3, unique=True))
    def add_placed(self, seq, blocks):
        self._try(Add(seq, len(blocks) * self.sim.config.block_size, blocks=tuple(blocks)))

    @rule(seq=NAMES, tokens=st.integers(1, 6))
    def grow(self, seq, tokens):
        self._try(Grow(seq, tokens))

    @rule(seq=NAMES, ids=st.lists(st.integers(0, 31_999), min_size=1, max_size=3))
    def grow_ids(self, seq, ids):
        self._try(Grow(seq, token_ids=tuple(ids)))

    @rule(seq=NAMES, new=NAMES)
    def fork(self, seq, new):
        self._try(Fork(seq, new))

    @rule(seq=NAMES)
    def free(self, seq):
        self._try(Free(seq))

    @rule(
        prompt=st.integers(1, 10),
        output=st.integers(1, 5),
        fan=st.sampled_from([{}, {"n": 2}, {"beam_width": 2}]),
        shared=st.booleans(),
    )
    def submit(self, prompt, output, fan, shared):
        self.requests += 1
        self._try(Submit(f"r{self.requests}", output, prompt_len=prompt, shared_prefix=4 if shared else 0, **fan))

    @rule(steps=st.integers(1, 3))
    def schedule(self, steps):
        self._try(Schedule(steps))

    @precondition(lambda self: self.timeline.position > 0)
    @rule(back=st.integers(1, 6))
    def seek_back_and_return(self, back):
        here = self.timeline.position
        before = state_fingerprint(self.sim)
        self.timeline.seek(max(0, here - back))
        check_invariants(self.sim)
        self.timeline.seek(here)
        assert state_fingerprint(self.sim) == before, "a seek there and back changed the state"

    @invariant()
    def invariants_hold(self):
        check_invariants(self.sim)
        check_cpu_pool(self.sim)


EngineMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestEngineStateful = EngineMachine.TestCase


class V1EngineMachine(EngineMachine):
    """The same operations under the v1 scheduler: a token budget small enough to chunk
    prompts, recompute only, the null block held from the start."""

    @initialize(
        block_size=st.sampled_from([1, 3, 4]),
        dtype=st.sampled_from(["float32", "float16", "bfloat16"]),
        prefix_caching=st.booleans(),
        budget=st.sampled_from([4, 7, 64]),
    )
    def start(self, block_size, dtype, prefix_caching, budget):
        self.begin(
            block_size=block_size,
            dtype=dtype,
            prefix_caching=prefix_caching,
            scheduler="v1",
            max_num_batched_tokens=budget,
        )

    # More traffic than the shared rules give, so steps chunk, preempt and finish often.
    @rule(
        prompts=st.lists(st.integers(1, 12), min_size=1, max_size=3),
        output=st.integers(1, 6),
        n=st.sampled_from([1, 1, 2]),
        shared=st.booleans(),
    )
    def submit_burst(self, prompts, output, n, shared):
        for prompt in prompts:
            self.submit(prompt, output, {"n": n} if n > 1 else {}, shared)

    @rule(steps=st.integers(2, 8))
    def run_steps(self, steps):
        self._try(Schedule(steps))


V1EngineMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestV1EngineStateful = V1EngineMachine.TestCase


def _exercise(sim):
    sim.apply(Add("a", prompt=tuple(range(1, 10))))
    sim.apply(Free("a"))
    sim.apply(Add("b", prompt=tuple(range(1, 10))))  # two prefix-cache hits on free cached blocks
    sim.apply(Add("c", 12))  # allocation reaches cached blocks: evictions


@pytest.mark.parametrize("mutation", ["hit leaves the free count", "cached-free count never decremented"])
@on_the_sources  # (it patches the compiled core)
def test_planted_pool_mutations_are_caught(monkeypatch, mutation):
    real_take = BlockPool._take

    def take_without_free_count(self, block_id):
        out = real_take(self, block_id)
        if self._ref_counts[block_id] == 1 and block_id in self._hash_of:
            self._num_free += 1  # as if the hit had not taken it off the free count
        return out

    def take_without_cached_count(self, block_id):
        cached = self._cached_free
        out = real_take(self, block_id)
        self._cached_free = cached
        return out

    mutant = take_without_free_count if mutation.startswith("hit") else take_without_cached_count
    config = CacheConfig(num_blocks=6, block_size=4, num_heads=1, head_dim=8, prefix_caching=True)
    sim = Simulator(config, BACKEND)
    monkeypatch.setattr(BlockPool, "_take", mutant)
    with pytest.raises(AssertionError, match=r"free queue's length|cached-free count"):
        _exercise(sim)
        check_invariants(sim)
