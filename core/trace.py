"""Traces of the v1 scheduler in the format of the vLLM v1 traces: a workload (a config and
requests with their prescribed output tokens) goes in, one JSON object a line comes out —
a header, a record per ``schedule()`` + ``update_from_output()`` step (what was scheduled,
preempted and finished, block tables, samples, free counts, queues, the step's KV events)
and a summary. :func:`compare_traces` says where two traces differ.

Block hashes are computed as vLLM computes them (:mod:`pagesim.core.kv_events`: SHA-256 over a
pickled ``(parent hash, token ids, extra keys)`` tuple, published as the low 64 bits) from a fixed root
(``NONE_HASH`` as vLLM derives it from ``PYTHONHASHSEED=0``). vLLM draws its root at random
per process unless that variable is set, so two traces' hashes match only up to renaming:
:func:`compare_traces` checks that one renaming maps every hash of one onto the other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pagesim.core.checks import all_ints, is_count, is_int
from pagesim.core.config import CacheConfig
from pagesim.core.engine import Simulator
from pagesim.core.errors import PagesimError
from pagesim.core.events import RequestRejected
from pagesim.core.kv_events import KVEventConverter
from pagesim.core.operations import CHILD_SEPARATOR, Schedule, Submit
from pagesim.core.scenario import read_scenario_text
from pagesim.core.token_model import MEMORY_ONLY_VOCAB

CONFIG_KEYS = ("num_gpu_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching")
DEFAULT_MAX_STEPS = 10_000
MAX_STEPS = 100_000  # a step a record: a longer trace is gigabytes, past reading or comparing


class WorkloadError(PagesimError):
    def __init__(self, source: str, message: str) -> None:
        super().__init__(f"{source}: {message}")


@dataclass(frozen=True)
class TraceRequest:
    id: str
    prompt: tuple[int, ...]
    max_new_tokens: int
    output: tuple[int, ...]
    arrival_step: int


@dataclass(frozen=True)
class Workload:
    config: dict
    requests: tuple[TraceRequest, ...]
    max_steps: int = DEFAULT_MAX_STEPS

    def cache_config(self) -> CacheConfig:
        c = self.config
        return CacheConfig(
            num_blocks=c["num_gpu_blocks"],
            block_size=c["block_size"],
            num_heads=1,
            head_dim=8,  # (memory management only: no K/V)
            scheduler="v1",
            max_num_seqs=c["max_num_seqs"],
            max_num_batched_tokens=c["max_num_batched_tokens"],
            prefix_caching=c["enable_prefix_caching"],
        )


WORKLOAD_KEYS = ("config", "requests", "max_steps", "seed")  # (seed: how the workload was drawn)
REQUEST_KEYS = ("id", "prompt", "max_new_tokens", "output", "arrival_step")


def _token_list(value, what: str, source: str) -> tuple[int, ...]:
    # (memory only: ids are hashed, never embedded, so any model's vocabulary will do)
    if (
        not isinstance(value, list)
        or not value
        or not all_ints(value)
        or not all(0 <= t < MEMORY_ONLY_VOCAB for t in value)
    ):
        raise WorkloadError(source, f"{what} must be a non-empty list of token ids in [0, 2^31)")
    return tuple(value)


def parse_workload(doc, source: str = "<memory>") -> Workload:
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("config"), dict)
        or not isinstance(doc.get("requests"), list)
    ):
        raise WorkloadError(source, "a workload is an object with a config object and a requests list")
    if unknown := sorted(set(doc) - set(WORKLOAD_KEYS)):  # (a misspelt max_steps would be ignored)
        raise WorkloadError(
            source, f"{unknown[0]} is not a field of a workload (its fields: {', '.join(WORKLOAD_KEYS)})"
        )
    config = doc["config"]
    if unknown := sorted(set(config) - set(CONFIG_KEYS)):  # (a misspelt key would otherwise read "missing")
        raise WorkloadError(
            source, f"config.{unknown[0]} is not a field of the format (its fields: {', '.join(CONFIG_KEYS)})"
        )
    for key in CONFIG_KEYS:
        if key not in config:
            raise WorkloadError(source, f"config.{key} is missing")
        value = config.get(key)
        valid = isinstance(value, bool) if key == "enable_prefix_caching" else is_count(value)
        if not valid:
            kind = "true or false" if key == "enable_prefix_caching" else "a positive integer"
            raise WorkloadError(source, f"config.{key} must be {kind}; got {value!r}")
    if config["num_gpu_blocks"] < 2:  # (vLLM's engine refuses a cache with no block to give)
        raise WorkloadError(source, "config.num_gpu_blocks must be at least 2: block 0 is the null block, never given")
    if "seed" in doc and not (is_int(doc["seed"]) and doc["seed"] >= 0):
        raise WorkloadError(source, f"seed must be a non-negative integer; got {doc['seed']!r}")
    max_steps = doc.get("max_steps", DEFAULT_MAX_STEPS)
    if not is_count(max_steps) or max_steps > MAX_STEPS:
        raise WorkloadError(source, f"max_steps must be an integer from 1 to {MAX_STEPS:,}; got {max_steps!r}")
    requests, seen = [], set()
    for i, raw in enumerate(doc["requests"]):
        where = f"requests[{i}]"
        if not isinstance(raw, dict):
            raise WorkloadError(source, f"{where} must be an object")
        if unknown := sorted(set(raw) - set(REQUEST_KEYS)):  # (a misspelt arrival_step would read as 0)
            raise WorkloadError(
                source, f"{where}.{unknown[0]} is not a field of a request (its fields: {', '.join(REQUEST_KEYS)})"
            )
        rid = raw.get("id")
        if not isinstance(rid, str) or not rid or CHILD_SEPARATOR in rid or rid in seen:
            raise WorkloadError(source, f"{where}.id must be a new non-empty name without '/'; got {rid!r}")
        seen.add(rid)
        count, arrival = raw.get("max_new_tokens"), raw.get("arrival_step", 0)
        if not is_count(count):
            raise WorkloadError(source, f"{where}.max_new_tokens must be a positive integer; got {count!r}")
        if not is_int(arrival) or not 0 <= arrival < max_steps:
            told = "" if "max_steps" in doc else f", max_steps being {DEFAULT_MAX_STEPS:,} when not given"
            raise WorkloadError(
                source,
                f"{where}.arrival_step must be an integer from 0 to max_steps − 1 ({max_steps - 1}{told}); "
                f"got {arrival!r}",
            )
        output = _token_list(raw.get("output"), f"{where}.output", source)
        if len(output) < count:
            raise WorkloadError(source, f"{where}.output holds {len(output)} tokens; max_new_tokens is {count}")
        prompt = _token_list(raw.get("prompt"), f"{where}.prompt", source)
        requests.append(TraceRequest(rid, prompt, count, output, arrival))
    workload = Workload({k: config[k] for k in CONFIG_KEYS}, tuple(requests), max_steps)
    try:
        workload.cache_config()
    except ValueError as exc:
        raise WorkloadError(source, f"config: {exc}") from None
    return workload


def load_workload(path: str | Path) -> Workload:
    source = str(path)
    text = read_scenario_text(path, "workload file", "JSON")  # a regular file of bounded size, in UTF-8
    try:
        doc = json.loads(text, object_pairs_hook=_object_without_repeats)
    except _RepeatedKey as exc:
        raise WorkloadError(source, f"{exc.key!r} is given twice in one object: which one is meant?") from None
    except (ValueError, RecursionError) as exc:  # (JSONDecodeError, or an integer of thousands of digits)
        raise WorkloadError(source, f"not valid JSON: {exc}") from None
    return parse_workload(doc, source)


class _RepeatedKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object_without_repeats(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object as a dict, refused when a key repeats (the last would silently win)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise _RepeatedKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return out


# -- running a workload -------------------------------------------------------------------
_TRACE_OMITS_NONE = ("parent_block_hash", "lora_id", "lora_name", "kv_cache_spec_sliding_window")


def trace_event(event) -> dict:
    """A vLLM KV event (:mod:`pagesim.core.kv_events`) as the traces write it: its tag as
    ``type``, then its fields, those that vLLM leaves None left out."""
    out = {"type": type(event).__name__}
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if value is None and name in _TRACE_OMITS_NONE:
            continue
        out[name] = value
    return out


KIND_ORDER = {"new": 0, "resumed": 1, "running": 2}


def run_workload(workload: Workload) -> list[dict]:
    """The v1 scheduler's trace of ``workload``: header, one record a step, summary."""
    return list(trace_records(workload))


def trace_records(workload: Workload) -> Iterator[dict]:
    """:func:`run_workload`'s records one at a time, as each step ends (a long trace is
    written as it goes, never held whole)."""
    config = workload.cache_config()
    sim = Simulator(config, kv_data=False)
    scheduler = sim.scheduler
    scheduler.record_tables = True
    converter = KVEventConverter(sim)
    arriving: dict[int, list[TraceRequest]] = {}
    for request in workload.requests:
        arriving.setdefault(request.arrival_step, []).append(request)
    header = {
        "kind": "header",
        "engine": "pagesim.core.scheduler_v1.SchedulerV1",
        "config": dict(workload.config),
        "usable_blocks": config.num_blocks - 1,
        "null_block_id": 0,
        "kv_events": "capture",
    }
    yield header
    finished, admitted, left = {}, {}, len(workload.requests)
    batches = events = 0  # the steps that captured KV events, and those events
    rejected: dict[str, str] = {}  # request -> why (vLLM's traces have none: never written for them)
    steps = 0
    for step in range(workload.max_steps):
        arrivals = arriving.get(step, [])
        for request in arrivals:
            submitted = sim.apply(Submit(request.id, request.max_new_tokens, prompt=request.prompt), attend=False)
            scheduler.prescribe(request.id, request.output)
            rejected.update(_rejections(submitted))
        left -= len(arrivals)
        result = sim.apply(Schedule(1), attend=False)
        rejected.update(_rejections(result))
        done = scheduler.last_step
        scheduled = sorted(done.scheduled, key=lambda s: KIND_ORDER[s.kind]) if done else []
        for entry in scheduled:
            if entry.prefix_hit_tokens is not None:
                admitted.setdefault(entry.request, []).append(entry.prefix_hit_tokens)
        for request in done.finished if done else ():
            finished[request] = {"step": step}
        free = sim.blocks.num_free
        kv_events = [trace_event(e) for e in converter.convert(result.op_events)]
        batches, events = batches + bool(kv_events), events + len(kv_events)
        yield (
            {
                "kind": "step",
                "step": step,
                "arrivals": [r.id for r in arrivals],
                # (vLLM 0.33 lists a request resumed after preemption among the new ones)
                "scheduled": [_scheduled(s) for s in scheduled],
                "total_scheduled_tokens": sum(s.tokens for s in scheduled),
                # (the traces list preempted and finished requests sorted, as from vLLM's sets)
                "preempted": sorted(done.preempted) if done else [],
                "block_tables": done.block_tables if done else {},
                "sampled": {r: [t] for r, t in done.sampled.items()} if done else {},
                "finished": sorted(done.finished) if done else [],
                "free_blocks_after_schedule": done.free_after_schedule if done else free,
                "free_blocks_after_update": done.free_after_update if done else free,
                "running": list(scheduler.running),
                "waiting": list(scheduler.waiting),
                "kv_events": kv_events,
            }
        )
        steps = step + 1
        if not left and not scheduler.running and not scheduler.waiting:
            break
    unfinished = [r.id for r in workload.requests if r.id not in finished and r.id not in rejected]
    summary = {
        "kind": "summary",
        "steps": steps,
        "finished": finished,
        "admission_prefix_hit_tokens": admitted,
        "unfinished": unfinished,
        "captured_event_batches": batches,
        "captured_events": events,
    }
    if rejected:
        summary["rejected"] = rejected
    yield summary


def _rejections(result) -> dict[str, str]:
    return {e.request: e.reason for e in result.op_events if isinstance(e, RequestRejected)}


def _scheduled(entry) -> dict:
    out = {"id": entry.request, "kind": "running" if entry.kind == "running" else "new", "tokens": entry.tokens}
    out["computed_before"] = entry.computed_before
    if entry.prefix_hit_tokens is not None:
        out["prefix_hit_tokens"] = entry.prefix_hit_tokens
    return out


def write_trace(records: Iterable[dict], out: IO[str]) -> dict:
    """Each record as a JSON line to ``out``, as it comes; returns the last (the summary)."""
    last: dict = {}
    for last in records:
        out.write(json.dumps(last) + "\n")
    return last


def read_trace(lines: Iterable[str]) -> list[dict]:
    return [json.loads(line) for line in lines if line.strip()]


# -- comparing ----------------------------------------------------------------------------
def _hash_fields(record: dict) -> Iterable[tuple[str, int]]:
    events = record.get("kv_events")
    for i, event in enumerate(events if isinstance(events, list) else ()):
        for value in event.get("block_hashes", ()):
            yield f"kv_events[{i}].block_hashes", value
        if "parent_block_hash" in event:
            yield f"kv_events[{i}].parent_block_hash", event["parent_block_hash"]


def _without_hashes(record: dict) -> dict:
    out = {k: v for k, v in record.items() if k != "engine"}
    if isinstance(record.get("kv_events"), list):
        out["kv_events"] = [
            {k: v for k, v in e.items() if k not in ("block_hashes", "parent_block_hash")}
            | {"hashes": len(e.get("block_hashes", ())), "has_parent": "parent_block_hash" in e}
            for e in record["kv_events"]
        ]
    return out


def compare_traces(ours: list[dict], theirs: list[dict], exact_hashes: bool = False) -> list[str]:
    """Where ``ours`` and ``theirs`` differ (empty: they agree), record by record and field
    by field. Block hashes must be equal with ``exact_hashes``; otherwise one renaming must
    map each hash of ``theirs`` onto one of ``ours`` and back, everywhere they occur (the
    same block content under the same parent chain has the same hash, in both)."""
    problems: list[str] = []
    if len(ours) != len(theirs):
        problems.append(f"{len(ours)} records against {len(theirs)}")
    forward: dict[int, int] = {}
    backward: dict[int, int] = {}
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        where = f"record {index} ({b.get('kind')} {b.get('step', '')})".rstrip()
        plain_a, plain_b = _without_hashes(a), _without_hashes(b)
        for key in sorted(set(plain_a) | set(plain_b)):
            if plain_a.get(key) != plain_b.get(key):
                problems.append(f"{where}: {key}: ours {plain_a.get(key)!r}, theirs {plain_b.get(key)!r}")
        for (field, ha), (_, hb) in zip(_hash_fields(a), _hash_fields(b), strict=False):
            if exact_hashes:
                if ha != hb:
                    problems.append(f"{where}: {field}: ours {ha}, theirs {hb}")
            elif forward.setdefault(hb, ha) != ha or backward.setdefault(ha, hb) != hb:
                problems.append(f"{where}: {field}: hash {hb} of theirs is not renamed consistently")
    return problems
