"""Beam search as a tree, as plain data: every beam each step kept, linked to the beam it
grew from, with its token's text and cumulative log-probability; which beams are alive, which
were pruned (their own blocks went back to the free queue) and the final hypotheses, ranked.

Beam names are reused (a freed ``b1`` may be forked again from ``b0`` in the same step), so the
tree follows the ``BeamsSelected`` events' parent links step by step, never the names alone.
It is rebuilt from the events of steps 1..k, so it is the same after a seek or a step back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from pagesim.core import events as ev

LIVE, KEPT, PRUNED, FINAL = "live", "kept", "pruned", "final"


@dataclass(frozen=True, slots=True)
class BeamNode:
    """One beam at one step: ``token`` chosen after its parent node's tokens (the root, the
    prompt, has none). ``continuation``: the text generated from the prompt up to here."""

    index: int
    parent: int | None
    step: int  # the timeline step that chose it (0: the prompt)
    depth: int  # tokens generated up to and with this one
    beam: str  # the sequence that carried it when chosen
    token: int | None
    text: str  # this token's text, decoded after its parent's
    continuation: str
    logprob: float  # cumulative
    state: str  # LIVE, KEPT (an ancestor of a live or final beam), PRUNED or FINAL
    pruned_at: int | None = None  # the step that dropped it (its own blocks freed)
    rank: int | None = None  # a final hypothesis: 0 = best


@dataclass(frozen=True)
class BeamTree:
    request: str
    width: int
    prompt_len: int
    nodes: tuple[BeamNode, ...]
    live: dict[str, int]  # live beam -> its newest node
    finals: tuple[int, ...]  # the final hypotheses' nodes, best first
    final_scores: tuple[float, ...]  # their log-probability per token (vLLM's ranking score)
    finished: bool

    def children(self, index: int) -> list[BeamNode]:
        return [n for n in self.nodes if n.parent == index]

    @property
    def depth(self) -> int:
        return max(n.depth for n in self.nodes)


class _Growing:
    def __init__(self, request: str, decode: Callable[[list[int]], str]):
        self.request, self.decode = request, decode
        self.nodes: list[dict] = [dict(parent=None, step=0, depth=0, beam="prompt", token=None, logprob=0.0)]
        self.live: dict[str, int] = {}

    def tokens(self, index: int | None) -> list[int]:
        out = []
        while index is not None and self.nodes[index]["token"] is not None:
            out.append(self.nodes[index]["token"])
            index = self.nodes[index]["parent"]
        return out[::-1]

    def add(self, parent: int, step: int, beam: str, token: int, logprob: float) -> int:
        depth = self.nodes[parent]["depth"] + 1
        self.nodes.append(dict(parent=parent, step=step, depth=depth, beam=beam, token=token, logprob=logprob))
        return len(self.nodes) - 1

    def select(self, step: int, event: ev.BeamsSelected) -> None:
        # At the first step every beam is a copy of the prompt: the root.
        chosen = {name: self.add(self.live.get(parent, 0), step, name, token, score)
                  for name, parent, token, score in event.beams}  # fmt: skip
        for name in event.dropped:
            if (node := self.live.get(name)) is not None:
                self.nodes[node]["pruned_at"] = step
        self.live = chosen

    def child_with(self, index: int, token: int) -> int | None:
        return next((i for i, n in enumerate(self.nodes) if n["parent"] == index and n["token"] == token), None)

    def final_node(self, tokens: tuple[int, ...], step: int, label: str, logprob: float) -> int:
        """The node whose path is ``tokens``; a hypothesis that ended with the end-of-sequence
        token gets that token as a new leaf (the search never kept it as a beam)."""
        node = 0
        for token in tokens:
            found = self.child_with(node, token)
            node = found if found is not None else self.add(node, step, label, token, logprob)
        return node

    def freeze(self, state, finished: bool) -> BeamTree:
        finals, scores = [], []
        if finished:
            penalty = state.sampling.length_penalty if state.sampling is not None else 1.0
            for label, tokens in state.outputs.items():
                logprob = state.beam_scores.get(label, 0.0)
                finals.append(self.final_node(tokens, self.nodes[-1]["step"], label, logprob))
                scores.append(logprob / max(len(state.prompt) + len(tokens), 1) ** penalty)
        ends = set(finals) if finished else set(self.live.values())
        alive = set()  # every node on the path to a live beam or a final hypothesis
        for end in ends:
            node = end
            while node is not None and node not in alive:
                alive.add(node)
                node = self.nodes[node]["parent"]
        texts: list[str] = []
        out = []
        for index, n in enumerate(self.nodes):
            continuation = self.decode(self.tokens(index)) if index else ""
            before = texts[n["parent"]] if n["parent"] is not None else ""
            text = continuation[len(before) :] if continuation.startswith(before) else self.decode([n["token"]])
            texts.append(continuation)
            if index in finals:
                status = FINAL
            elif index in ends:
                status = LIVE
            else:
                status = KEPT if index in alive else PRUNED
            rank = finals.index(index) if index in finals else None
            out.append(BeamNode(index=index, text=text if index else "", continuation=continuation,
                                state=status, rank=rank, pruned_at=n.get("pruned_at"), **{k: n[k] for k in (
                                    "parent", "step", "depth", "beam", "token", "logprob")}))  # fmt: skip
        return BeamTree(
            self.request, state.beam_width, len(state.prompt), tuple(out),
            {} if finished else dict(self.live), tuple(finals), tuple(scores), finished,
        )  # fmt: skip


def build_beam_trees(
    steps: Iterable[tuple[int, Iterable[ev.Event]]], requests: Mapping, decode: Callable[[list[int]], str]
) -> tuple[BeamTree, ...]:
    """The trees of the beam searches in ``steps`` ((step, its events), in order), with
    ``requests`` the scheduler's states now (their outputs, once finished)."""
    growing: dict[str, _Growing] = {}
    for step, step_events in steps:
        for event in step_events:
            if type(event) is ev.BeamsSelected:
                tree = growing.setdefault(event.request, _Growing(event.request, decode))
                tree.select(step, event)
    return tuple(
        tree.freeze(requests[request], requests[request].status == "finished")
        for request, tree in growing.items()
        if request in requests
    )


def timeline_beam_trees(timeline) -> tuple[BeamTree, ...]:
    """The beam trees up to the timeline's current step: only a real model's beam search
    chooses beams by log-probability (the synthetic model has no tokenizer)."""
    sim = timeline.sim
    tokenizer = getattr(getattr(sim.runner, "model", None), "tokenizer", None)
    requests = getattr(sim.scheduler, "requests", None)
    if tokenizer is None or not requests or not any(getattr(s, "beam_width", 0) > 1 for s in requests.values()):
        return ()
    steps = (
        (k, result.op_events) for k in range(1, timeline.position + 1) if (result := timeline.result(k)) is not None
    )
    return build_beam_trees(steps, requests, tokenizer.decode)
