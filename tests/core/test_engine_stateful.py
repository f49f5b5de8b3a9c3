"""Random add/grow/fork/free sequences, checking the invariants after every operation."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from core.config import CacheConfig
from core.engine import Simulator
from core.errors import PagesimError
from core.operations import Add, Fork, Free, Grow
from kernels.cpu_backend import CpuBackend
from tests.core.helpers import check_invariants, state_fingerprint

NAMES = st.sampled_from([f"s{i}" for i in range(8)])
BACKEND = CpuBackend()


class EngineMachine(RuleBasedStateMachine):
    @initialize(
        block_size=st.sampled_from([1, 3, 4]),
        dtype=st.sampled_from(["float32", "bfloat16"]),
        prefix_caching=st.booleans(),
    )
    def start(self, block_size, dtype, prefix_caching):
        config = CacheConfig(
            num_blocks=12,
            block_size=block_size,
            num_heads=2,
            num_kv_heads=1,
            head_dim=8,
            dtype=dtype,
            prefix_caching=prefix_caching,
        )
        self.sim = Simulator(config, BACKEND)

    def _try(self, op):
        before = state_fingerprint(self.sim)
        try:
            result = self.sim.apply(op, attend=len(self.sim.sequences) < 4)
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

    @rule(seq=NAMES, tokens=st.integers(1, 6))
    def grow(self, seq, tokens):
        self._try(Grow(seq, tokens))

    @rule(seq=NAMES, new=NAMES)
    def fork(self, seq, new):
        self._try(Fork(seq, new))

    @rule(seq=NAMES)
    def free(self, seq):
        self._try(Free(seq))

    @invariant()
    def invariants_hold(self):
        check_invariants(self.sim)


EngineMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestEngineStateful = EngineMachine.TestCase
