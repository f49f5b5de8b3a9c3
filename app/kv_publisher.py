"""Publishing KV events over ZeroMQ as vLLM's ``ZmqEventPublisher`` does, so that any
consumer of a vLLM server's stream (``--kv-events-config`` with the zmq publisher) can
consume pagesim's.

The wire format, from ``vllm/distributed/kv_events.py``:

- a PUB socket sends each batch as three frames: the topic (UTF-8, default empty), the
  batch's sequence number (8 bytes, big-endian, from 0) and the msgspec-MessagePack payload
  of a ``KVEventBatch`` (:mod:`pagesim.core.kv_events`);
- an optional ROUTER socket answers a replay request (one frame: the first sequence number
  wanted, 8 bytes big-endian, after the REQ/DEALER empty delimiter) with every buffered batch
  from there, each as ``(seq, payload)``, then ``(-1 as 8 signed bytes, b"")``;
- the last ``buffer_steps`` batches are kept for replay; the PUB socket's high-water mark
  is ``hwm``; a thread owns both sockets and sends from a queue.

Unlike vLLM, which binds only a wildcard address and connects otherwise, pagesim always
binds (it is the server: ``pagesim attach`` connects); ``tcp://127.0.0.1:*`` binds a free port,
which :attr:`KVEventPublisher.endpoint` then names.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
from pathlib import Path

import zmq
from pagesim.core.checks import is_port_text, utf8_error
from pagesim.core.errors import PagesimError
from pagesim.core.kv_events import KVEventBatch, KVEventConverter, encode_batch, make_batch

END_SEQ = (-1).to_bytes(8, "big", signed=True)
POLL_S = 0.05


class PublisherError(PagesimError):
    pass


def bind_problem(endpoint: str, option: str) -> str | None:
    """Why ``endpoint`` is not one to publish on, in words (None: it looks like one). ZeroMQ
    itself takes a tcp port past 65535 modulo 65536, and inproc:// reaches no other process."""
    transport, sep, address = endpoint.strip().partition("://")
    if not sep or transport not in ("tcp", "ipc"):
        if transport == "inproc":
            return f"{option} {endpoint!r}: inproc:// reaches no other process; use tcp://127.0.0.1:PORT"
        return f"{option} {endpoint!r} is not a ZeroMQ endpoint to publish on: write tcp://127.0.0.1:PORT"
    if transport == "ipc":
        if not address:
            return f"{option} {endpoint!r} names no path"
        if address.startswith("~"):  # (ZeroMQ takes it as a name, not the home folder)
            return f"{option} {endpoint!r}: write the path in full (ZeroMQ does not expand ~)"
        path = Path(address)
        if path.is_dir():
            return f"{option} {endpoint!r}: {address} is a folder; name a socket file to create"
        if path.exists() and not path.is_socket():  # ZeroMQ deletes whatever the path holds to bind
            return (
                f"{option} {endpoint!r}: {address} is an existing file, not a socket, and binding would delete it; "
                "name a new path"
            )
        if path.is_socket() and _socket_in_use(path):  # (a stale one, left by a run that died, is rebound)
            return f"{option} {endpoint!r}: another program is listening on {address}; name another path"
        if not path.parent.is_dir():
            return f"{option} {endpoint!r}: the folder {path.parent} does not exist"
        return None
    host, colon, port = address.rpartition(":")
    if not colon or not host or any(c.isspace() for c in host) or not (port == "*" or is_port_text(port)):
        return f"{option} {endpoint!r} needs a host and a port from 1 to 65535 (or * for a free one)"
    return None


def _socket_in_use(path: Path) -> bool:
    """A program accepts connections on the Unix socket at ``path`` (binding over it would
    take its clients and, on close, delete its file)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


class KVEventPublisher:
    """vLLM's PUB/ROUTER publisher with an in-memory replay buffer. Use as a context manager
    or call :meth:`close`: the thread stops, what was queued is sent, every socket closes."""

    SHUTDOWN_TIMEOUT = 2.0

    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        data_parallel_rank: int = 0,
    ) -> None:
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: zmq.Socket | None = None
        self.endpoint: str | None = None
        self.replay_endpoint: str | None = None
        try:
            self._pub.set_hwm(hwm)
            self._pub.bind(endpoint)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.bind(replay_endpoint)
                self.replay_endpoint = self._replay.getsockopt_string(zmq.LAST_ENDPOINT)
        except zmq.ZMQError as exc:
            self._close_sockets()
            where = endpoint if self._replay is None else replay_endpoint
            raise PublisherError(f"cannot publish KV events on {where}: {exc}") from None
        self.topic = topic.encode("utf-8")
        self.rank = data_parallel_rank
        self._queue: queue.Queue[KVEventBatch | None] = queue.Queue(maxsize=max_queue_size)
        self._buffer: list[tuple[int, bytes]] = []
        self._buffer_steps = buffer_steps
        self._lock = threading.Lock()
        self.sent = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kv-event-publisher", daemon=True)
        self._thread.start()

    def __enter__(self) -> KVEventPublisher:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def publish(self, batch: KVEventBatch) -> None:
        if self._closed:
            raise PublisherError("the KV event publisher is closed")
        if batch.data_parallel_rank is None:
            batch.data_parallel_rank = self.rank
        self._queue.put(batch, timeout=self.SHUTDOWN_TIMEOUT)

    def _run(self) -> None:
        seq = 0
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                batch = self._queue.get(timeout=POLL_S)
            except queue.Empty:
                continue
            if batch is None:
                return
            payload = encode_batch(batch)
            self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
            with self._lock:
                self._buffer.append((seq, payload))
                del self._buffer[: -self._buffer_steps]
                self.sent = seq + 1
            seq += 1

    def _serve_replay(self) -> None:
        assert self._replay is not None
        frames = self._replay.recv_multipart()
        if len(frames) != 3:  # (identity, empty delimiter, start) or nothing sensible
            return
        client, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        with self._lock:
            wanted = [(s, p) for s, p in self._buffer if s >= start]
        for s, payload in wanted:
            self._replay.send_multipart((client, b"", s.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))

    def serve_for(self, seconds: float) -> None:
        """Keep answering replay requests (the thread does) for ``seconds``, then return."""
        self._thread.join(timeout=max(0.0, seconds))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=self.SHUTDOWN_TIMEOUT)
        self._thread.join(timeout=self.SHUTDOWN_TIMEOUT)
        self._close_sockets()

    def _close_sockets(self) -> None:
        # A short linger lets the last batches leave; then the context ends with no socket open.
        self._pub.close(linger=int(self.SHUTDOWN_TIMEOUT * 500))
        if self._replay is not None:
            self._replay.close(linger=0)
        self._ctx.term()
        for endpoint in (self.endpoint, self.replay_endpoint):  # (ZeroMQ leaves an ipc socket's file behind)
            if endpoint and endpoint.startswith("ipc://"):
                with contextlib.suppress(OSError):
                    path = Path(endpoint[len("ipc://") :])
                    if path.is_socket():
                        path.unlink()


# -- pagesim run --kv-events ----------------------------------------------------------------
DEFAULT_TOPIC = ""
DEFAULT_LINGER_SECONDS = 1.0


def add_run_options(parser) -> None:
    group = parser.add_argument_group("KV events (vLLM's wire format, over ZeroMQ)")
    group.add_argument(
        "--kv-events", metavar="ENDPOINT", help="publish each step's KV events here, e.g. tcp://127.0.0.1:5557"
    )
    group.add_argument("--kv-events-replay", metavar="ENDPOINT", help="answer replay requests here (a ROUTER)")
    # (no defaults here: given without --kv-events they would be ignored, so that is refused)
    group.add_argument("--kv-events-topic", metavar="TOPIC", help="the topic frame (default: empty)")
    group.add_argument(
        "--kv-events-linger",
        type=float,
        metavar="S",
        help="seconds to wait for subscribers before the first step and for replays after the last (default 1)",
    )


class StepPublisher:
    """A run's steps published as they happen: each step's engine events converted to one
    ``KVEventBatch`` (a step without any publishes nothing, as in vLLM)."""

    def __init__(self, sim, publisher: KVEventPublisher, linger: float) -> None:
        self.converter = KVEventConverter(sim)
        self.publisher = publisher
        self.linger = linger
        publisher.serve_for(linger)  # PUB drops what it sends before a subscriber has joined

    def step(self, result) -> None:
        if events := self.converter.convert(result.op_events):
            self.publisher.publish(make_batch(events))

    def finish(self) -> None:
        self.publisher.serve_for(self.linger)
        self.publisher.close()


def check_publisher_options(args) -> None:
    """Refuse ``--kv-events``' options that cannot work, before the scenario (maybe a model)
    loads: a refusal after seconds of loading tells nothing the options did not."""
    given = {
        "--kv-events-replay": args.kv_events_replay,
        "--kv-events-topic": args.kv_events_topic,
        "--kv-events-linger": args.kv_events_linger,
    }
    if args.kv_events is None:
        if stray := [option for option, value in given.items() if value is not None]:
            raise PublisherError(f"{stray[0]} needs --kv-events")
        return
    if args.kv_events_topic is None:
        args.kv_events_topic = DEFAULT_TOPIC
    if args.kv_events_linger is None:
        args.kv_events_linger = DEFAULT_LINGER_SECONDS
    if not 0 <= args.kv_events_linger <= 600:
        raise PublisherError(f"--kv-events-linger must be between 0 and 600 seconds; got {args.kv_events_linger}")
    for endpoint, option in ((args.kv_events, "--kv-events"), (args.kv_events_replay, "--kv-events-replay")):
        if endpoint is not None and (problem := bind_problem(endpoint, option)):
            raise PublisherError(problem)
    if args.kv_events_replay is not None and args.kv_events.strip() == args.kv_events_replay.strip():
        raise PublisherError("--kv-events and --kv-events-replay name the same endpoint: give each its own")
    if utf8_error(args.kv_events_topic) is not None:
        raise PublisherError("--kv-events-topic is not valid UTF-8 text")


def open_step_publisher(args, sim, say) -> StepPublisher | None:
    """The run's publisher when ``--kv-events`` asks for one."""
    check_publisher_options(args)
    if args.kv_events is None:
        return None
    publisher = KVEventPublisher(args.kv_events, args.kv_events_replay, topic=args.kv_events_topic)
    replay = f" · replay {publisher.replay_endpoint}" if publisher.replay_endpoint else ""
    say(f"KV events: {publisher.endpoint}{replay}")
    return StepPublisher(sim, publisher, args.kv_events_linger)
