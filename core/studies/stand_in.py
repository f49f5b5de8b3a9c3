"""A real model's scenario as the memory-only studies (what-if, latency) can replay it.

A replay computes no K/V (``kv_data=False``), and a real model cannot run without its
K/V, so the studies replay such a scenario on the synthetic model instead: the same
operations, prompt lengths, output lengths and settings, its token ids folded into the
synthetic vocabulary (equal ids stay equal, so shared prefixes still hit the prefix
cache). The blocks each step takes follow from the lengths alone; what differs is the
generated text, and with it any end-of-sequence stop: every sequence decodes its whole
output length."""

from __future__ import annotations

from dataclasses import replace

from pagesim.core.language_model import SYNTHETIC
from pagesim.core.operations import Add, Grow, Operation, Submit
from pagesim.core.scenario import Scenario
from pagesim.core.token_model import VOCAB_SIZE


def _fold(ids: tuple[int, ...] | None) -> tuple[int, ...] | None:
    return None if ids is None else tuple(t % VOCAB_SIZE for t in ids)


def _synthetic_operation(op: Operation) -> Operation:
    if isinstance(op, Add | Submit) and op.prompt is not None:
        return replace(op, prompt=_fold(op.prompt))
    if isinstance(op, Grow) and op.token_ids is not None:
        return replace(op, token_ids=_fold(op.token_ids))
    return op


def memory_only(scenario: Scenario) -> tuple[Scenario, str]:
    """The scenario a memory-only replay runs, and a note for the reader ("" when it is
    ``scenario`` itself, on the synthetic model already)."""
    model = scenario.config.model
    if model == SYNTHETIC:
        return scenario, ""
    operations = tuple(_synthetic_operation(op) for op in scenario.operations)
    stand_in = Scenario(
        scenario.name,
        scenario.description,
        replace(scenario.config, model=SYNTHETIC),
        operations,
        scenario.source,
        scenario.notes,
    )
    note = (
        f"{model} is played by the synthetic model here (the studies compute no K/V): the same prompts and "
        "lengths, other generated tokens, no end-of-sequence stops"
    )
    return stand_in, note
