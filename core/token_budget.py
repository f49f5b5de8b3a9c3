"""A v1 step's token budget as plain data: what each request computed in the step, decode
tokens and prefill chunks, against ``max_num_batched_tokens``; and how far each running
request's prefill has come. Read from the v1 scheduler's ``last_step`` after a step; the
views draw it and never touch the scheduler.

pagesim's v0 scheduler has no budget (it admits by free blocks and prefills whole prompts),
so a v0 step has none to show.
"""

from __future__ import annotations

from dataclasses import dataclass

from pagesim.core.operations import Schedule
from pagesim.core.scheduler_v1 import RUNNING, SchedulerV1


@dataclass(frozen=True)
class BudgetSegment:
    """One request's share of a step: ``tokens`` computed, from ``computed_before`` on, of
    the ``target`` it had to compute (its prompt; after a preemption, prompt and outputs)."""

    request: str
    kind: str  # "decode" (its newest sampled token) or "prefill" (a chunk of prompt, or a recompute)
    tokens: int
    computed_before: int
    target: int
    prompt_len: int
    max_tokens: int
    admission: str  # "new", "resumed" (after a preemption) or "running"
    prefix_hit_tokens: int  # tokens its admission found in the prefix cache (outside the budget)
    sampled: bool  # the chunk reached its last token: the step sampled one
    finished: bool  # that sample was its last

    @property
    def computed_after(self) -> int:
        return self.computed_before + self.tokens

    @property
    def outputs_before(self) -> int:
        return self.target - self.prompt_len

    def describe(self) -> str:
        """One sentence for a tooltip: "r2: prefill chunk of 256 tokens (512/1024 of its prompt)"."""
        if self.kind == "decode":
            done = "; its last output: finished" if self.finished else ""
            return (
                f"{self.request}: decode of 1 token (context {self.computed_after}; "
                f"{self.outputs_before} of {self.max_tokens} outputs so far){done}"
            )
        tokens = f"{self.tokens} token{'s' * (self.tokens != 1)}"
        if self.outputs_before:  # a preempted request computes its prompt and its outputs again
            text = (
                f"{self.request}: recompute chunk of {tokens} ({self.computed_after}/{self.target}: its prompt and "
                f"{self.outputs_before} generated token{'s' * (self.outputs_before != 1)} again, after a preemption)"
            )
        else:
            text = f"{self.request}: prefill chunk of {tokens} ({self.computed_after}/{self.target} of its prompt)"
        if self.prefix_hit_tokens:
            text += f"; {self.prefix_hit_tokens} tokens came from the prefix cache, outside the budget"
        if self.admission == "new":
            text += "; admitted this step"
        elif self.admission == "resumed":
            text += "; readmitted this step"
        if self.sampled:
            text += "; it sampled a token" if self.outputs_before else "; prompt done: it sampled its first token"
        if self.finished:
            text += ", its last: finished"
        return text


@dataclass(frozen=True)
class TokenBudget:
    """What one v1 step computed, running requests first, then admissions (vLLM's order)."""

    budget: int  # max_num_batched_tokens
    segments: tuple[BudgetSegment, ...]
    preempted: tuple[str, ...]  # a step that preempted admits nobody
    steps: int  # the operation's scheduler steps: the segments are its last one's

    @property
    def decode_tokens(self) -> int:
        return sum(s.tokens for s in self.segments if s.kind == "decode")

    @property
    def prefill_tokens(self) -> int:
        return sum(s.tokens for s in self.segments if s.kind == "prefill")

    @property
    def used(self) -> int:
        return self.decode_tokens + self.prefill_tokens

    def summary(self) -> str:
        text = (
            f"{self.decode_tokens} decode + {self.prefill_tokens} prefill = {self.used} of "
            f"{self.budget} tokens (max_num_batched_tokens)"
        )
        if self.preempted:
            text += f" · preempted {', '.join(self.preempted)}: no admissions this step"
        if self.steps > 1:
            text += f" · the last of {self.steps} steps"
        return text


def _segment(scheduler: SchedulerV1, scheduled, last) -> BudgetSegment:
    state = scheduler.requests[scheduled.request]
    did_sample = scheduled.request in last.sampled
    target = len(state.tokens) - did_sample  # the tokens it held when the step began
    decode = (
        scheduled.kind == "running"
        and scheduled.tokens == 1
        and target > state.prompt_len
        and scheduled.computed_before == target - 1
    )
    return BudgetSegment(
        request=scheduled.request,
        kind="decode" if decode else "prefill",
        tokens=scheduled.tokens,
        computed_before=scheduled.computed_before,
        target=target,
        prompt_len=state.prompt_len,
        max_tokens=state.max_tokens,
        admission=scheduled.kind,
        prefix_hit_tokens=scheduled.prefix_hit_tokens or 0,
        sampled=did_sample,
        finished=scheduled.request in last.finished,
    )


def step_budget(scheduler, op) -> TokenBudget | None:
    """The budget of the step ``op`` just ran; None unless ``op`` is a schedule of the v1
    scheduler that scheduled something (``last_step`` outlives other operations)."""
    if not isinstance(scheduler, SchedulerV1) or not isinstance(op, Schedule):
        return None
    last = scheduler.last_step
    if last is None:
        return None
    segments = tuple(_segment(scheduler, s, last) for s in last.scheduled)
    budget = scheduler.config.max_num_batched_tokens
    return TokenBudget(budget, segments, tuple(last.preempted), op.steps)


def prefill_progress(scheduler) -> dict[str, tuple[int, int]]:
    """Running v1 requests not yet computed to their newest token: (computed, to compute)."""
    if not isinstance(scheduler, SchedulerV1):
        return {}
    progress = {}
    for request in scheduler.running:
        state = scheduler.requests[request]
        target = state.prompt_len if state.num_outputs == 0 else len(state.tokens) - 1
        if state.status == RUNNING and state.computed < target:
            progress[request] = (state.computed, target)
    return progress
