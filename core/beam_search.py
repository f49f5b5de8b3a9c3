"""Beam search on a real model, as vLLM v0 ran it inside the engine.

Each decode step, before the beams' tokens are written, every live beam's last logits
give log-probabilities; the ``2 × width`` best (beam, token) pairs by cumulative
log-probability are the candidates (vLLM's ``_beam_search_sample``). A candidate that ends
with the end-of-sequence token is a finished hypothesis; the best ``width`` of the others
are the next beams. A beam chosen ``k`` times goes on as itself and ``k - 1`` forks (they
share its blocks: copy-on-write when each writes its own token); a beam chosen by none is
freed, its blocks back to the free queue unless another beam still holds them. Finished
hypotheses are ranked by ``cumulative log-probability / length ** length_penalty``
(length: prompt and output, vLLM's ``get_beam_search_score``); with ``width`` of them, the
search stops once no running beam can beat the worst (vLLM's ``early_stopping=False``), and
at ``output_len`` the running beams join them. The request's outputs are the best
``width``, best first.

The synthetic token model has no logits: its beam requests keep the shape of beam search
(:func:`~pagesim.core.scheduler.prune_beams`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pagesim.core import events as ev
from pagesim.core.registry import SequenceRegistry

if TYPE_CHECKING:
    import torch  # (imported on first use, as in kernels/reference.py: the app's window should not wait for it)


@dataclass(frozen=True, slots=True)
class Hypothesis:
    """A finished beam: its generated tokens and cumulative log-probability."""

    label: str
    tokens: tuple[int, ...]
    logprob: float

    def score(self, prompt_len: int, length_penalty: float, eos_id: int | None) -> float:
        length = prompt_len + len(self.tokens) - (bool(self.tokens) and self.tokens[-1] == eos_id)
        return self.logprob / max(length, 1) ** length_penalty


@dataclass(frozen=True, slots=True)
class Candidate:
    logprob: float  # cumulative, with the token
    parent: str
    token: int


def candidates(logits: dict[str, torch.Tensor], scores: dict[str, float], parents: list[str], width: int):
    """The ``2 × width`` best (parent, token) pairs by cumulative log-probability; ties go
    to the earlier parent, then the smaller token id (the order is reproducible)."""
    import torch

    found: list[Candidate] = []
    for parent in parents:
        logprobs = torch.log_softmax(logits[parent].to(torch.float64), -1)
        top = torch.topk(logprobs, min(2 * width, logprobs.numel()))
        base = scores.get(parent, 0.0)
        found += [Candidate(base + float(v), parent, int(t)) for v, t in zip(top.values, top.indices, strict=True)]
    order = {p: i for i, p in enumerate(parents)}
    found.sort(key=lambda c: (-c.logprob, order[c.parent], c.token))
    return found[: 2 * width]


def _fresh_name(state, registry: SequenceRegistry, reuse: list[str]) -> str:
    if reuse:
        return reuse.pop(0)
    while registry.is_taken(name := f"{state.request}/b{state.beam_serial}"):
        state.beam_serial += 1
    state.beam_serial += 1
    return name


def select_beams(state, registry: SequenceRegistry, logits: dict[str, torch.Tensor], eos_id: int | None, events):
    """One step of the search for ``state`` (a v0 ``RequestState``): the next beams formed
    by freeing and forking, their tokens left in ``state.next_tokens``. Returns True when
    the search is over (every beam freed; the outputs chosen)."""
    width, prompt_len = state.beam_width, len(state.prompt)
    penalty = state.sampling.length_penalty if state.sampling is not None else 1.0
    stop_at_eos = state.sampling is None or state.sampling.stop_at_eos
    # At the first step the beams are copies of the prompt: one of them proposes.
    parents = state.seqs[:1] if state.generated == 0 else list(state.seqs)
    chosen: list[Candidate] = []
    for cand in candidates(logits, state.beam_scores, parents, width):
        if cand.token == eos_id and stop_at_eos:
            generated = registry.sequence(cand.parent).token_ids[prompt_len:]
            label = f"{state.request}/h{len(state.hypotheses)}"
            state.hypotheses.append(Hypothesis(label, (*generated, cand.token), cand.logprob))
        elif len(chosen) < width:
            chosen.append(cand)
    state.hypotheses = ranked(state, penalty, eos_id)[:width]
    if not chosen or _no_beam_can_win(state, chosen[0], penalty, eos_id):
        finish_beams(state, registry, eos_id, keep_running=False)
        return True
    children: dict[str, list[Candidate]] = {}
    for cand in chosen:
        children.setdefault(cand.parent, []).append(cand)
    dropped = [seq_id for seq_id in state.seqs if seq_id not in children]
    for seq_id in dropped:
        registry.free(seq_id)
    reuse = sorted(dropped)
    beams, state.next_tokens, scores = [], {}, {}
    for parent, picks in children.items():
        names = [parent] + [_fresh_name(state, registry, reuse) for _ in picks[1:]]
        for name, cand in zip(names, picks, strict=True):
            if name != parent:
                registry.fork(parent, name, owner=state.request)
            state.next_tokens[name], scores[name] = cand.token, cand.logprob
            beams.append((name, parent, cand.token, cand.logprob))
    state.seqs, state.beam_scores = [b[0] for b in beams], scores
    beams.sort(key=lambda b: -b[3])
    events.add(ev.BeamsSelected, state.request, tuple(beams), tuple(dropped))
    return False


def ranked(state, penalty: float, eos_id: int | None) -> list[Hypothesis]:
    prompt_len = len(state.prompt)
    return sorted(state.hypotheses, key=lambda h: -h.score(prompt_len, penalty, eos_id))


def _no_beam_can_win(state, best: Candidate, penalty: float, eos_id: int | None) -> bool:
    if len(state.hypotheses) < state.beam_width:
        return False
    worst = state.hypotheses[-1].score(len(state.prompt), penalty, eos_id)
    length = len(state.prompt) + state.generated + 1
    return worst >= best.logprob / length**penalty


def finish_beams(state, registry: SequenceRegistry, eos_id: int | None, keep_running: bool = True) -> None:
    """The search is over: every beam is freed and the best ``beam_width`` hypotheses
    become the request's outputs, best first. ``keep_running``: the running beams are
    hypotheses too (they reached ``output_len``); an early stop drops them, as vLLM does."""
    prompt_len = len(state.prompt)
    penalty = state.sampling.length_penalty if state.sampling is not None else 1.0
    for seq_id in state.seqs:
        if keep_running:
            generated = tuple(registry.sequence(seq_id).token_ids[prompt_len:])
            state.hypotheses.append(Hypothesis(seq_id, generated, state.beam_scores.get(seq_id, 0.0)))
        registry.free(seq_id)
    state.seqs = []
    best = ranked(state, penalty, eos_id)[: state.beam_width]
    state.outputs = {h.label: h.tokens for h in best}
    state.beam_scores = {h.label: h.logprob for h in best}
