"""``pagesim attach``: subscribe to a KV-event stream in vLLM's wire format (a vLLM server
started with ``--kv-events-config`` and the zmq publisher, or ``pagesim run --kv-events``)
and show its prefix cache as it changes: the cached blocks as a tree of prefixes (each
block under its parent hash), their tokens (decoded with a tokenizer), what was stored and
removed, and the prefix-hit rate the events imply.

The decoder reads every shape vLLM has published: a batch as an array ``[ts, events,
rank]`` or a map, each event a tagged map (``{"type": "BlockStored", ...}``) or a tagged
array (``["BlockStored", hashes, parent, tokens, block_size, lora_id, medium, ...]``), hashes
as integers or bytes. A gap in the sequence numbers is filled from the replay socket when
one is given (vLLM's protocol: the first sequence number wanted, 8 bytes big-endian; the
batches from there, then -1).

The app's File → Attach to vLLM… window follows a stream with the same subscriber, view and
prefix tree (:mod:`pagesim.app.gui.attach`).
"""

from __future__ import annotations

import itertools
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import msgspec
import zmq
from pagesim.core import kv_events as kv
from pagesim.core.checks import is_count, is_int, is_port_text, utf8_error
from pagesim.core.errors import PagesimError
from pagesim.core.language_model import real_model_problem

# Each KV event's fields in wire order (an array-shaped event lists them after its tag).
FIELDS = {c.__struct_config__.tag: c.__struct_fields__ for c in (kv.BlockStored, kv.BlockRemoved, kv.AllBlocksCleared)}
REPLAY_TIMEOUT_MS = 1000
HISTORY_KEPT = 100_000  # batches
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"  # vLLM's default KV-event endpoint, seen from this machine
TRANSPORTS = ("tcp", "ipc")  # (inproc:// reaches no other process)
HINT_AFTER_S = 5.0  # nothing received for this long: say what a server needs to publish
SERVER_FLAGS = (
    '--kv-events-config \'{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557", '
    '"replay_endpoint": "tcp://*:5558"}\''
)
SILENT_HINT = (
    "is the server running with prefix caching and " + SERVER_FLAGS + ", and is it serving requests? It publishes "
    "only when its cache changes"
)


class AttachError(PagesimError):
    pass


def endpoint_problem(endpoint: str, what: str = "endpoint") -> str | None:
    """Why ``endpoint`` is not one to connect to, in words (None: it looks like one)."""
    endpoint = endpoint.strip()
    example = f"e.g. {DEFAULT_ENDPOINT}"
    if not endpoint:
        return f"give the server's KV-event {what}, {example}"
    transport, sep, address = endpoint.partition("://")
    if transport == "inproc":
        return f"{endpoint!r}: inproc:// reaches no other process; write tcp://HOST:PORT ({example})"
    if not sep or transport not in TRANSPORTS:
        return f"{endpoint!r} is not a ZeroMQ {what}: write tcp://HOST:PORT ({example})"
    if transport != "tcp":
        return None if address else f"{endpoint!r} names no address"
    host, colon, port = address.rpartition(":")
    if not colon or not host or any(c.isspace() for c in host) or not is_port_text(port):
        return f"{endpoint!r} needs a host and a port from 1 to 65535 ({example})"
    if host == "*":
        return f"{endpoint!r} is the address a server binds; attach to its host, e.g. tcp://127.0.0.1:{port}"
    return None


def _event(raw) -> dict | None:
    """One event as a dict with its ``type``, from either shape; None if not a KV event (a
    kind this reader does not know). A ValueError says what is wrong with a known one."""
    if isinstance(raw, dict):
        kind = raw.get("type")
        event = dict(raw) if kind in FIELDS else None
    elif isinstance(raw, list) and raw and raw[0] in FIELDS:
        event = {"type": raw[0], **dict(zip(FIELDS[raw[0]], raw[1:], strict=False))}
    else:
        return None
    if event is not None:
        _check_event(event)
    return event


def _is_hash(value) -> bool:
    return is_int(value) or isinstance(value, bytes)


def _check_event(event: dict) -> None:
    """The fields the view reads, of the types vLLM sends (a stream that breaks them is not
    vLLM's, or not this version's: the event is skipped and counted, not half applied)."""
    kind = event["type"]
    if kind == "AllBlocksCleared":
        return
    hashes = event.get("block_hashes")
    if not isinstance(hashes, list) or not all(map(_is_hash, hashes)):
        raise ValueError(f"{kind}: block_hashes is not a list of hashes")
    if kind == "BlockStored":
        parent, tokens, size = event.get("parent_block_hash"), event.get("token_ids"), event.get("block_size")
        if parent is not None and not _is_hash(parent):
            raise ValueError("BlockStored: parent_block_hash is not a hash")
        if not isinstance(tokens, list) or not all(is_int(t) and t >= 0 for t in tokens):
            raise ValueError("BlockStored: token_ids is not a list of token ids (integers ≥ 0)")
        if size is not None and not is_count(size):
            raise ValueError("BlockStored: block_size is not a positive integer")


def decode_batch(payload: bytes) -> tuple[float, list[dict], int]:
    """A batch's timestamp, its events (unknown kinds are skipped) and how many of its events
    were malformed (skipped too). A ValueError or msgspec's DecodeError: not a batch at all."""
    raw = msgspec.msgpack.decode(payload)
    if isinstance(raw, dict):
        ts, events = raw.get("ts"), raw.get("events")
    elif isinstance(raw, list) and len(raw) >= 2:
        ts, events = raw[0], raw[1]
    else:
        raise ValueError("not a KV event batch")
    if not isinstance(events, list):
        raise ValueError("a KV event batch without an event list")
    if ts is not None and (not isinstance(ts, int | float) or isinstance(ts, bool)):
        raise ValueError("a KV event batch whose timestamp is not a number")
    out, bad = [], 0
    for raw_event in events:
        try:
            event = _event(raw_event)
        except ValueError:
            bad += 1
            continue
        if event is not None:
            out.append(event)
    return float(ts or 0.0), out, bad


def decode_payload(payload: bytes) -> tuple[float, list[dict]]:
    """A batch's timestamp and its well-formed KV events."""
    ts, events, _ = decode_batch(payload)
    return ts, events


def short(block_hash) -> str:
    if isinstance(block_hash, bytes):
        return block_hash.hex()[:8]
    return f"{block_hash & ((1 << 64) - 1):016x}"[-8:] if isinstance(block_hash, int) else str(block_hash)[:8]


@dataclass
class Node:
    parent: object
    tokens: list[int]
    count: int = 1  # blocks holding this prefix (vLLM may cache one prefix twice)
    children: dict = field(default_factory=dict)  # an ordered set


class PrefixCacheView:
    """The prefix cache a stream describes, and its counters."""

    def __init__(self) -> None:
        self.nodes: dict[object, Node] = {}
        self.block_size: int | None = None
        self.batches = self.events = self.stored = self.removed = self.cleared = self.unknown_removals = 0
        self.last_seq = -1
        self.restarts = 0  # the publisher began its numbers again: a restarted server, its cache empty
        self.skipped_messages = self.bad_events = 0  # what the subscriber could not read (set by attach)
        self.missed_batches = 0  # ... nor receive: numbers it skipped that no replay filled
        self.interrupted = False  # stopped by Ctrl-C before its bound
        self.requests = self.reused_tokens = self.computed_tokens = 0
        # (seq, ts, stored, removed, cached blocks) of the newest batches: a long attach stays bounded.
        self.history: deque[tuple[int, float, int, int, int]] = deque(maxlen=HISTORY_KEPT)

    def _depth(self, key) -> int:
        depth, seen = 0, set()
        while key in self.nodes and key not in seen:
            seen.add(key)
            depth += 1
            key = self.nodes[key].parent
        return depth

    def _store(self, event: dict) -> None:
        hashes, tokens = event.get("block_hashes") or [], event.get("token_ids") or []
        bs = event.get("block_size") or (len(tokens) // max(1, len(hashes)))
        self.block_size = bs
        parent = event.get("parent_block_hash")
        # The hit rate the events imply: a store whose parent is absent starts a request with
        # nothing reused; one that branches off a cached prefix starts a request that reused it.
        # A store that extends a leaf continues whoever stored the leaf (a later chunk, a decode).
        if parent is None:
            self.requests += 1
        elif parent in self.nodes and self.nodes[parent].children:
            self.requests += 1
            self.reused_tokens += self._depth(parent) * bs
        self.computed_tokens += len(tokens)
        for i, key in enumerate(hashes):
            node = self.nodes.get(key)
            if node is None:
                node = self.nodes[key] = Node(parent, list(tokens[i * bs : (i + 1) * bs]))
            else:
                node.count += 1
            # (a block already cached under another parent keeps its place: a stream that says
            # otherwise would make the tree a cycle)
            if parent in self.nodes and node.parent == parent and parent != key:
                self.nodes[parent].children[key] = None
            parent = key
        self.stored += len(hashes)

    def _remove(self, event: dict) -> None:
        for key in event.get("block_hashes") or []:
            node = self.nodes.get(key)
            if node is None:
                self.unknown_removals += 1
                continue
            self.removed += 1
            node.count -= 1
            if node.count == 0:
                del self.nodes[key]
                if node.parent in self.nodes:
                    self.nodes[node.parent].children.pop(key, None)

    def apply(self, seq: int, ts: float, events: list[dict]) -> None:
        if seq <= self.last_seq:  # numbered from the start again: a new publisher, an empty cache
            self.restarts += 1
            self.nodes.clear()
        self.last_seq = seq
        stored, removed = self.stored, self.removed
        for event in events:
            self.events += 1
            kind = event["type"]
            if kind == "BlockStored":
                self._store(event)
            elif kind == "BlockRemoved":
                self._remove(event)
            else:
                self.cleared += 1
                self.nodes.clear()
        self.batches += 1
        self.history.append((seq, ts, self.stored - stored, self.removed - removed, self.cached_blocks))

    @property
    def cached_blocks(self) -> int:
        return sum(n.count for n in self.nodes.values())

    @property
    def hit_rate(self) -> float | None:
        total = self.reused_tokens + self.computed_tokens
        return self.reused_tokens / total if total else None

    def status(self) -> str:
        rate = "n/a" if self.hit_rate is None else f"{self.hit_rate:.1%}"
        return (
            f"{self.batches} batches, {self.events} events · stored {self.stored}, removed {self.removed}"
            + (f", cleared {self.cleared}×" if self.cleared else "")
            + f" · cached {self.cached_blocks} blocks ({self.leaves} longest prefix{'' if self.leaves == 1 else 'es'})"
            + f" · implied hit rate {rate}"
            + (f" · the publisher restarted {self.restarts}× (its cache shown from then)" if self.restarts else "")
        )

    def problems(self) -> list[str]:
        """What could not be read, in words (nothing when all was)."""
        out = []
        if self.missed_batches:
            out.append(
                f"{self.missed_batches} batches missed: the sequence numbers skipped them and no replay filled them "
                "in (give the server's replay socket to fill gaps); the tree may lack their blocks"
            )
        if self.skipped_messages:
            out.append(f"{self.skipped_messages} messages skipped: not KV event batches in vLLM's wire format")
        if self.bad_events:
            out.append(f"{self.bad_events} events skipped: a field of the wrong type")
        if self.unknown_removals:
            out.append(f"{self.unknown_removals} removals of blocks never seen stored (stored before attaching)")
        return out

    @property
    def leaves(self) -> int:
        """Cached prefixes no longer one extends: the tree's ends (every block names the prefix
        up to it, so a count of those would be the block count again)."""
        return sum(1 for node in self.nodes.values() if not node.children)

    def runs(self) -> Iterator[PrefixRun]:
        """The cached prefixes depth first, each run of single-child blocks as one."""
        roots = [k for k, n in self.nodes.items() if n.parent not in self.nodes]
        stack = [(k, 0) for k in reversed(roots)]
        seen: set = set()  # (each block once, whatever the stream said of its parents)
        unreached = iter(self.nodes)  # blocks whose parents' chain loops back to them: roots too, last
        while True:
            if not stack:
                key = next((k for k in unreached if k not in seen), None)
                if key is None:
                    return
                stack.append((key, 0))
            key, depth = stack.pop()
            if key in seen:
                continue
            seen.add(key)
            run = [key]
            while (
                len(self.nodes[run[-1]].children) == 1
                and (child := next(iter(self.nodes[run[-1]].children))) not in seen
            ):
                seen.add(child)
                run.append(child)
            yield PrefixRun(
                depth=depth,
                hashes=tuple(run),
                tokens=tuple(t for k in run for t in self.nodes[k].tokens),
                twins=max(self.nodes[k].count for k in run),
                orphan=depth == 0 and self.nodes[key].parent is not None,
            )
            stack.extend((child, depth + 1) for child in reversed(list(self.nodes[run[-1]].children)))

    def tree(self, decode=None, max_lines: int = 60, width: int = 72) -> list[str]:
        """The cached prefixes as text, one line per run."""
        runs = list(itertools.islice(self.runs(), max_lines + 1))
        lines = [run.line(decode, width) for run in runs[:max_lines]]
        if len(runs) > max_lines:
            lines.append(f"… ({sum(1 for _ in self.runs())} lines in all)")
        return lines


@dataclass(frozen=True)
class PrefixRun:
    """One line of the prefix tree: cached blocks each the only child of the one before,
    ``depth`` levels below a block whose parent is not cached."""

    depth: int
    hashes: tuple
    tokens: tuple[int, ...]
    twins: int  # most copies of one block of the run (vLLM may cache one prefix twice)
    orphan: bool  # its parent block was evicted (a root that is not the start of a prompt)

    @property
    def label(self) -> str:
        first, last = self.hashes[0], self.hashes[-1]
        return short(first) if len(self.hashes) == 1 else f"{short(first)}…{short(last)}"

    @property
    def blocks(self) -> str:
        count = len(self.hashes)
        return f"{count} block{'s' * (count > 1)}" + (f" ×{self.twins}" if self.twins > 1 else "")

    def text(self, decode: Callable[[list[int]], str] | None = None, width: int | None = None) -> str:
        """Its tokens: decoded (quoted), or the ids; cut to ``width`` with "…"."""
        text = repr(decode(list(self.tokens))) if decode is not None else " ".join(map(str, self.tokens))
        return text if width is None or len(text) <= width else text[: width - 1] + "…"

    def line(self, decode=None, width: int = 72) -> str:
        orphan = " (parent evicted)" if self.orphan else ""
        return f"{'  ' * self.depth}└ {self.label} [{self.blocks}]{orphan} {self.text(decode, width)}"


# -- the subscriber ---------------------------------------------------------------------------
class Subscriber:
    """A SUB socket on the stream and, optionally, a DEALER on the replay socket; closed by
    :meth:`close` (or the ``with`` block)."""

    def __init__(self, endpoint: str, replay: str | None = None, topic: str = "") -> None:
        self.endpoint = endpoint
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.replay = None
        try:
            self.sub.connect(endpoint)
            self.sub.setsockopt(zmq.SUBSCRIBE, topic.encode("utf-8"))
            if replay is not None:
                self.replay = self.ctx.socket(zmq.DEALER)
                self.replay.connect(replay)
        except zmq.ZMQError as exc:
            self.close()
            raise AttachError(f"cannot attach to {endpoint}: {exc}") from None
        self.last_seq = -1
        self.skipped = 0  # messages that were no KV event batch
        self.bad_events = 0  # events of a known kind with a field of the wrong type
        self.missed = 0  # batches numbered past the last one seen that never came (no replay, or not from it)
        self._last_payload = b""

    def __enter__(self) -> Subscriber:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.sub.close(linger=0)
        if self.replay is not None:
            self.replay.close(linger=0)
        self.ctx.term()

    def _fill_gap(self, until: int) -> list[tuple[int, bytes]]:
        """The batches after ``last_seq`` and before ``until`` from the replay socket."""
        if self.replay is None:
            return []
        self.replay.send_multipart([b"", (self.last_seq + 1).to_bytes(8, "big")])
        got: list[tuple[int, bytes]] = []
        for _ in range(1_000_000):  # bounded: each answer within the timeout, the end marker last
            if not self.replay.poll(REPLAY_TIMEOUT_MS):
                break
            frames = self.replay.recv_multipart()
            if frames and frames[0] == b"":
                frames = frames[1:]
            seq_bytes, payload = frames[-2:] if len(frames) >= 2 else (b"", b"")
            seq = int.from_bytes(seq_bytes, "big", signed=True)
            if seq < 0 or not payload:
                break
            if self.last_seq < seq < until and (not got or seq > got[-1][0]):  # (in order, each number once)
                got.append((seq, payload))
        return got

    def batches(self, timeout_ms: int) -> list[tuple[int, float, list[dict]]]:
        """The next batches decoded, as ``(seq, ts, events)``, or [] after the timeout; a
        payload that is no KV event batch is counted in ``skipped`` and left out."""
        out = []
        try:
            received = self.receive(timeout_ms)
        except zmq.ZMQError as exc:
            raise AttachError(f"the stream from {self.endpoint} failed: {exc}") from None
        for seq, payload in received:
            try:
                ts, events, bad = decode_batch(payload)
            except (msgspec.DecodeError, ValueError, TypeError):
                self.skipped += 1
                continue
            self.bad_events += bad
            out.append((seq, ts, events))
        return out

    def receive(self, timeout_ms: int) -> list[tuple[int, bytes]]:
        """The next batches in order (a gap filled by replay first), or [] after the timeout."""
        if not self.sub.poll(timeout_ms):
            return []
        frames = self.sub.recv_multipart()
        if len(frames) != 3 or len(frames[1]) != 8:  # (topic, sequence number, payload)
            self.skipped += 1
            return []
        seq = int.from_bytes(frames[1], "big")
        if seq == self.last_seq and frames[2] == self._last_payload:
            return []  # (the same batch again)
        self._last_payload = frames[2]
        if seq <= self.last_seq:  # a restarted publisher numbers from 0 again (its #0 after an old #0 too)
            self.last_seq = seq
            return [(seq, frames[2])]
        out = self._fill_gap(seq) if seq > self.last_seq + 1 else []
        if self.last_seq >= 0:  # (what came before attaching is no gap: the replay's history at most)
            self.missed += seq - self.last_seq - 1 - len(out)
        out.append((seq, frames[2]))
        self.last_seq = seq
        return out


def attach(
    endpoint: str,
    replay: str | None = None,
    topic: str = "",
    duration: float | None = None,
    max_events: int | None = None,
    on_batch=None,
    on_silence=None,
) -> PrefixCacheView:
    """Follow the stream until ``duration`` seconds have passed or ``max_events`` events came
    (neither: until interrupted), calling ``on_batch(view, seq)`` after each batch, and
    ``on_silence()`` once if nothing came in the first :data:`HINT_AFTER_S` seconds."""
    view = PrefixCacheView()
    started = time.monotonic()
    deadline = None if duration is None else started + duration
    with Subscriber(endpoint, replay, topic) as sub:
        try:
            while max_events is None or view.events < max_events:
                left = 1.0 if deadline is None else deadline - time.monotonic()
                if left <= 0:
                    break
                for seq, ts, events in sub.batches(int(min(left, 1.0) * 1000) + 1):
                    view.apply(seq, ts, events)
                    if on_batch is not None:
                        on_batch(view, seq)
                silent = not view.batches and not sub.skipped  # (unreadable messages are said otherwise)
                if on_silence is not None and silent and time.monotonic() - started >= HINT_AFTER_S:
                    on_silence()
                    on_silence = None
        except KeyboardInterrupt:  # Ctrl-C: what was seen so far is still worth its summary
            view.interrupted = True
        view.skipped_messages, view.bad_events, view.missed_batches = sub.skipped, sub.bad_events, sub.missed
    return view


# -- the command ---------------------------------------------------------------------------
MAX_TREE_LINES = 1_000_000  # --lines: a tree longer than this is no longer read


def add_parser(sub) -> None:
    p = sub.add_parser("attach", help="show a vLLM server's prefix cache live from its KV events (ZeroMQ)")
    p.add_argument("endpoint", help=f"the server's KV-event publisher, e.g. {DEFAULT_ENDPOINT}")
    p.add_argument("--replay", metavar="ENDPOINT", help="its replay socket, to fill gaps (e.g. tcp://127.0.0.1:5558)")
    p.add_argument("--topic", default="", help="the topic to subscribe to (default: every topic)")
    p.add_argument("--tokenizer", metavar="MODEL", help='decode tokens with this model\'s tokenizer ("smollm2-135m")')
    p.add_argument("--duration", type=float, metavar="S", help="stop after S seconds (default: follow until Ctrl-C)")
    p.add_argument("--max-events", type=int, metavar="N", help="stop after N events (default: follow until Ctrl-C)")
    p.add_argument("--lines", type=int, default=60, metavar="N", help="prefix-tree lines to print at most")
    p.add_argument("--quiet", action="store_true", help="no line per batch: only the final summary")


def load_tokenizer(name: str) -> Callable[[list[int]], str]:
    """The decode function of model ``name``'s tokenizer (it reads the model file). An id
    outside its vocabulary (another model's stream) reads as ⟨id N⟩, in place: the tokenizer
    would drop it silently, or fail on one past 2^32."""
    from pagesim.core.models.catalog import load_model  # lazy: loads the model file

    tokenizer = load_model(name).tokenizer
    vocab = tokenizer.vocab_size

    def decode(ids: list[int]) -> str:
        runs = itertools.groupby(ids, lambda token: 0 <= token < vocab)  # (runs in the vocabulary decode together)
        return "".join(
            tokenizer.decode(list(run)) if known else "".join(f"⟨id {token}⟩" for token in run) for known, run in runs
        )

    return decode


def cmd_attach(args) -> int:
    if utf8_error(args.topic) is not None:
        raise AttachError("--topic is not valid UTF-8 text")
    if args.duration is not None and not 0 < args.duration <= 86_400:
        raise AttachError(f"--duration must be between 0 and 86400 seconds; got {args.duration}")
    if args.max_events is not None and args.max_events < 1:
        raise AttachError(f"--max-events must be a positive integer; got {args.max_events}")
    if not 0 <= args.lines <= MAX_TREE_LINES:
        raise AttachError(f"--lines must be from 0 to {MAX_TREE_LINES:,}; got {args.lines}")
    for endpoint, what in ((args.endpoint, "endpoint"), (args.replay, "replay endpoint")):
        if endpoint is not None and (problem := endpoint_problem(endpoint, what)):
            raise AttachError(problem)
    if args.tokenizer and (problem := real_model_problem(args.tokenizer, "--tokenizer")) is not None:
        raise AttachError(problem)
    decode = load_tokenizer(args.tokenizer) if args.tokenizer else None
    bound = [f"{args.duration:g} s" if args.duration else "", f"{args.max_events} events" if args.max_events else ""]
    print(f"pagesim attach · {args.endpoint}" + (f" (replay {args.replay})" if args.replay else ""))
    print(f"until {' or '.join(b for b in bound if b) or 'Ctrl-C'}", flush=True)

    def on_batch(view: PrefixCacheView, seq: int) -> None:
        if not args.quiet:
            _, _, stored, removed, cached = view.history[-1]
            print(f"#{seq}: +{stored} stored −{removed} removed · cached {cached} · {view.status()}", flush=True)

    def on_silence() -> None:
        print(f"note: nothing from {args.endpoint} in {HINT_AFTER_S:g} s: {SILENT_HINT}", file=sys.stderr, flush=True)

    view = attach(args.endpoint, args.replay, args.topic, args.duration, args.max_events, on_batch, on_silence)
    print("")
    if view.interrupted:
        print("interrupted: what was received until then", file=sys.stderr)
    print(view.status())
    for problem in view.problems():
        print(f"note: {problem}", file=sys.stderr)
    if view.block_size:
        print(f"block size {view.block_size}; reused {view.reused_tokens} tokens, computed {view.computed_tokens}")
    if not view.batches and not view.skipped_messages:
        print(f"note: no KV events came from {args.endpoint}: {SILENT_HINT}", file=sys.stderr)
    print("prefix tree (cached blocks under their parents):" if view.nodes else "prefix cache: empty")
    for line in view.tree(decode, max_lines=args.lines):
        print(line)
    sys.stdout.flush()
    return 130 if view.interrupted else 0
