"""A real model's scenario as the memory-only studies (what-if, latency) can replay it.

A replay computes no K/V (``kv_data=False``), and a real model cannot run without its
K/V, so the studies replay such a scenario on the synthetic model instead: the same
operations, context window, prompts (a memory-only run takes any model's token ids: they are only
hashed, so shared prefixes hit the prefix cache exactly as they would), output lengths and
settings. The blocks each step takes follow from the lengths alone; what differs is the
generated text, and with it any end-of-sequence stop: every sequence decodes its whole
output length."""

from __future__ import annotations

from dataclasses import replace

from pagesim.core.language_model import SYNTHETIC
from pagesim.core.scenario import Scenario


def memory_only(scenario: Scenario) -> tuple[Scenario, str]:
    """The scenario a memory-only replay runs, and a note for the reader ("" when it is
    ``scenario`` itself, on the synthetic model already)."""
    model = scenario.config.model
    if model == SYNTHETIC:
        return scenario, ""
    stand_in = replace(scenario, config=replace(scenario.config, model=SYNTHETIC))  # (its window kept)
    note = (
        f"{model} is played by the synthetic model here (the studies compute no K/V): the same prompts and "
        "lengths and its context window, other generated tokens, no end-of-sequence stops"
    )
    return stand_in, note
