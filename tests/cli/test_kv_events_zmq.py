"""KV events over ZeroMQ: pagesim's publisher speaks vLLM's protocol (three frames, sequence
numbers, the replay socket), and ``pagesim attach`` follows a stream from a publisher in a
subprocess that speaks the wire format by hand, and from ``pagesim run --kv-events``.
Every socket is on 127.0.0.1, every wait is bounded, every socket closed."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import time

import msgspec
import pytest
import zmq
from pagesim.app.cli import main as cli_main
from pagesim.app.kv_attach import (
    DEFAULT_ENDPOINT,
    PrefixCacheView,
    Subscriber,
    attach,
    decode_batch,
    decode_payload,
    endpoint_problem,
)
from pagesim.app.kv_publisher import END_SEQ, KVEventPublisher, bind_problem
from pagesim.core import kv_events as kv
from pagesim.core.scenario import load_scenario, scenario_file
from pagesim.core.timeline import Timeline
from pagesim.kernels.cpu_backend import CpuBackend

from tests.scenarios import token_model


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _publisher_and_subscriber():
    """A bare PUB socket on a free local port and a :class:`Subscriber` on it."""
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = free_port()
    pub.bind(f"tcp://127.0.0.1:{port}")
    try:
        with Subscriber(f"tcp://127.0.0.1:{port}") as sub:
            yield pub, sub
    finally:
        pub.close(linger=0)
        ctx.term()


def _receive(sub, got: list, count: int, seconds: float = 10.0) -> list:
    """``got`` and what the subscriber receives next, until ``count`` batches (or the time is out)."""
    deadline = time.monotonic() + seconds
    while len(got) < count and time.monotonic() < deadline:
        got += sub.batches(200)
    return got


def _until_received(sub, send, seconds: float = 10.0) -> list:
    """Send the same first batch until the subscriber has it (a PUB socket drops what it
    sends before the subscription reaches it; a repeat of the same batch is dropped as one)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        send()
        if got := sub.batches(100):
            return got
    raise AssertionError("the subscriber never received the first batch")


def stored(hashes, parent, tokens, bs=2):
    return kv.BlockStored(hashes, parent, tokens, bs, None, "GPU", None, [None] * len(hashes), 0, "full_attention")


def test_publisher_frames_sequence_numbers_and_replay():
    ctx = zmq.Context()
    with KVEventPublisher("tcp://127.0.0.1:*", "tcp://127.0.0.1:*", topic="kv-events") as pub:
        sub = ctx.socket(zmq.SUB)
        dealer = ctx.socket(zmq.DEALER)
        try:
            sub.connect(pub.endpoint)
            sub.setsockopt(zmq.SUBSCRIBE, b"kv-events")
            dealer.connect(pub.replay_endpoint)
            time.sleep(0.3)  # the subscription reaches the PUB socket
            batches = [kv.make_batch([stored([10 + i], None, [i, i])], ts=float(i)) for i in range(4)]
            for batch in batches:
                pub.publish(batch)
            for i in range(4):
                assert sub.poll(5000)
                topic, seq, payload = sub.recv_multipart()
                assert topic == b"kv-events" and seq == i.to_bytes(8, "big")
                assert kv.decode_batch(payload) == batches[i] and batches[i].data_parallel_rank == 0
            dealer.send_multipart([b"", (2).to_bytes(8, "big")])
            replies = []
            for _ in range(10):
                assert dealer.poll(5000)
                replies.append(dealer.recv_multipart())
                if replies[-1][1] == END_SEQ:
                    break
            assert [r[1] for r in replies] == [(2).to_bytes(8, "big"), (3).to_bytes(8, "big"), END_SEQ]
            assert replies[-1][2] == b"" and kv.decode_batch(replies[0][2]) == batches[2]
        finally:
            sub.close(linger=0)
            dealer.close(linger=0)
            ctx.term()


def test_the_view_of_a_stream():
    view = PrefixCacheView()
    view.apply(
        0,
        0.0,
        [
            {
                "type": "BlockStored",
                "block_hashes": [1, 2],
                "parent_block_hash": None,
                "token_ids": [5, 6, 7, 8],
                "block_size": 2,
            }
        ],
    )
    # A second request shares block 1 and branches: it reused 2 tokens and computed 2.
    view.apply(
        1,
        0.0,
        [
            {"type": "BlockStored", "block_hashes": [3], "parent_block_hash": 1, "token_ids": [9, 9], "block_size": 2},
            {"type": "BlockRemoved", "block_hashes": [2]},
        ],
    )
    assert view.cached_blocks == 2 and view.stored == 3 and view.removed == 1
    assert view.reused_tokens == 2 and view.computed_tokens == 6 and view.requests == 2
    assert view.tree()[0].startswith("└ 00000001…00000003 [2 blocks] 5 6 9 9")
    view.apply(2, 0.0, [{"type": "AllBlocksCleared"}])
    assert view.cached_blocks == 0 and view.cleared == 1


def test_decoder_reads_every_shape_vllm_published():
    legacy = msgspec.msgpack.encode([1.5, [["BlockStored", [7], None, [1, 2], 2, None, "GPU"], ["BlockRemoved", [7]]]])
    ts, events = decode_payload(legacy)
    assert ts == 1.5 and events[0]["token_ids"] == [1, 2] and events[1] == {"type": "BlockRemoved", "block_hashes": [7]}
    mixed = msgspec.msgpack.encode([2.0, [{"type": "AllBlocksCleared"}], 0])
    assert decode_payload(mixed) == (2.0, [{"type": "AllBlocksCleared"}])
    current = kv.encode_batch(kv.make_batch([stored([b"\x01" * 32], None, [3, 4])], ts=3.0))
    assert decode_payload(current)[1][0]["block_hashes"] == [b"\x01" * 32]


# A publisher that knows nothing of pagesim: vLLM's protocol written out by hand.
PUBLISHER = textwrap.dedent(
    """
    import sys, time, msgspec, zmq
    pub_port, replay_port = sys.argv[1], sys.argv[2]
    ctx = zmq.Context()
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    pub.bind(f"tcp://127.0.0.1:{pub_port}")
    router.bind(f"tcp://127.0.0.1:{replay_port}")
    def stored(hashes, parent, tokens):
        return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
                "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None, "group_idx": 0}
    batches = [
        {"ts": 1.0, "events": [stored([101, 102], None, [1, 2, 3, 4, 5, 6, 7, 8])], "data_parallel_rank": 0},
        {"ts": 2.0, "events": [stored([203], 101, [9, 9, 9, 9])]},
        # the older shape: the batch and its events as arrays
        [3.0, [["BlockRemoved", [102], "GPU"], ["BlockStored", [304], 203, [4, 4, 4, 4], 4, None, "GPU"]]],
    ]
    payloads = [msgspec.msgpack.encode(b) for b in batches]
    time.sleep(float(sys.argv[3]))
    for seq, payload in enumerate(payloads):
        pub.send_multipart([b"kv-events", seq.to_bytes(8, "big"), payload])
    end, again = time.monotonic() + 8, 0.0
    while time.monotonic() < end:
        if time.monotonic() > again:  # the newest batch again: a late subscriber asks replay for the rest
            pub.send_multipart([b"kv-events", (len(payloads) - 1).to_bytes(8, "big"), payloads[-1]])
            again = time.monotonic() + 0.5
        if router.poll(100):
            client, _, start = router.recv_multipart()
            for seq, payload in enumerate(payloads):
                if seq >= int.from_bytes(start, "big"):
                    router.send_multipart([client, b"", seq.to_bytes(8, "big"), payload])
            router.send_multipart([client, b"", (-1).to_bytes(8, "big", signed=True), b""])
    pub.close(0); router.close(0); ctx.term()
    """
)


def test_attach_follows_a_subprocess_publisher(tmp_path):
    script = tmp_path / "publisher.py"
    script.write_text(PUBLISHER)
    port, replay = free_port(), free_port()
    # The publisher sends after 1.5 s and repeats its newest batch: the subscriber sees them
    # live, or (started late on a busy machine) fills the gap by replay.
    publisher = subprocess.Popen([sys.executable, str(script), str(port), str(replay), "1.5"])
    try:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pagesim.app.cli",
                "attach",
                f"tcp://127.0.0.1:{port}",
                "--replay",
                f"tcp://127.0.0.1:{replay}",
                "--max-events",
                "4",
                "--duration",
                "20",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        publisher.wait(timeout=30)
    assert out.returncode == 0, out.stderr
    assert "3 batches, 4 events · stored 4, removed 1 · cached 3 blocks (1 longest prefix)" in out.stdout
    tree = out.stdout.split("prefix tree (cached blocks under their parents):\n")[1]
    assert tree.startswith("└ 00000065…00000130 [3 blocks] 1 2 3 4 9 9 9 9 4 4 4 4\n")


def test_attach_follows_pagesim_run(tmp_path):
    port, replay = free_port(), free_port()
    timeline = Timeline(
        load_scenario(token_model("shared_system_prompt")), CpuBackend(), snapshot_data=False, history=False
    )
    converter = kv.KVEventConverter(timeline.sim)
    expected = []
    while not timeline.at_end:
        expected += converter.convert(timeline.forward().op_events)
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pagesim.app.cli",
            "run",
            token_model("shared_system_prompt"),
            "--quiet",
            "--kv-events",
            f"tcp://127.0.0.1:{port}",
            "--kv-events-replay",
            f"tcp://127.0.0.1:{replay}",
            "--kv-events-linger",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        view = attach(f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay}", duration=30, max_events=len(expected))
    finally:
        _, err = run.communicate(timeout=60)
    assert run.returncode == 0, err
    assert view.events == len(expected) and view.batches == len({s for s, *_ in view.history})
    assert view.cached_blocks == len(timeline.sim.blocks.pool.cached_blocks())


def test_an_endpoint_that_cannot_be_attached_to_is_named_with_a_fix():
    assert endpoint_problem("tcp://127.0.0.1:5557") is None and endpoint_problem("ipc:///tmp/kv") is None
    assert "e.g. tcp://127.0.0.1:5557" in endpoint_problem("")
    assert "not a ZeroMQ endpoint" in endpoint_problem("localhost:5557")
    assert "port from 1 to 65535" in endpoint_problem("tcp://127.0.0.1:70000")
    assert "attach to its host, e.g. tcp://127.0.0.1:5557" in endpoint_problem("tcp://*:5557")
    # (digits to str.isdigit that int() refused: a ValueError out of the app's Attach dialog)
    for odd in ("tcp://127.0.0.1:²", "tcp://127.0.0.1:٣", "tcp://host name:5557"):
        assert "port from 1 to 65535" in endpoint_problem(odd)
        assert "port from 1 to 65535" in bind_problem(odd, "--kv-events")


def test_attach_refuses_a_bad_endpoint_before_listening(capsys):
    assert cli_main(["attach", "tcp://*:5557", "--duration", "1"]) == 2
    assert "the address a server binds" in capsys.readouterr().err
    assert cli_main(["attach", DEFAULT_ENDPOINT, "--replay", "5558", "--duration", "1"]) == 2
    assert "not a ZeroMQ replay endpoint" in capsys.readouterr().err


def _stored(hashes, parent, tokens, bs=4):
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": bs}  # fmt: skip


def test_events_with_fields_of_the_wrong_type_are_skipped_and_counted_not_a_traceback():
    good = _stored([1], None, [1, 2, 3, 4])
    bad = [
        _stored(5, None, [1, 2, 3, 4]),  # hashes not a list
        _stored([[1, 2]], None, [1, 2, 3, 4]),  # a hash that is a list
        _stored([2], None, [1, 2, 3, 4], bs="4"),  # block size a string
        _stored([3], "x", [1, 2, 3, 4]),  # parent not a hash
        _stored([4], None, [1, "a"]),  # a token that is no id
        _stored([6], None, [-1, 2, 3, 4]),  # a negative id (decoding it overflowed, after the stream was read)
        {"type": "BlockRemoved", "block_hashes": 3},
    ]
    ts, events, skipped = decode_batch(msgspec.msgpack.encode([1.0, [good, *bad, {"type": "Unknown"}]]))
    assert events == [good] and skipped == len(bad)  # (an unknown kind is no error: a newer vLLM's)
    view = PrefixCacheView()
    view.apply(0, ts, events)
    assert view.cached_blocks == 1


def test_ids_outside_the_tokenizers_vocabulary_are_shown_in_place_not_dropped_or_a_traceback():
    # (another model's stream: 50000 was dropped from the text, 10**18 raised OverflowError)
    from pagesim.app.kv_attach import load_tokenizer

    decode = load_tokenizer("smollm2-135m")
    text = decode([50_000, 504, 10**18])
    assert text.startswith("⟨id 50000⟩") and text.endswith("⟨id 1000000000000000000⟩") and len(text) > 32


def test_a_stream_that_makes_the_prefix_tree_a_cycle_still_draws_each_block_once():
    view = PrefixCacheView()
    view.apply(0, 0.0, [_stored([10, 11], None, [1, 2, 3, 4, 5, 6, 7, 8])])
    view.apply(1, 0.0, [_stored([10], 11, [1, 2, 3, 4])])  # 10 under 11, which is under 10
    runs = list(view.runs())  # (it looped for ever)
    assert sorted(h for run in runs for h in run.hashes) == [10, 11]
    assert len(view.tree()) == len(runs)


def test_a_publisher_that_restarts_is_followed_and_said_to_have_restarted():
    view = PrefixCacheView()
    view.apply(0, 0.0, [_stored([1], None, [1, 2, 3, 4])])
    view.apply(1, 0.0, [_stored([2], 1, [5, 6, 7, 8])])
    view.apply(0, 0.0, [_stored([9], None, [9, 9, 9, 9])])  # numbered from 0 again
    assert view.restarts == 1 and list(view.nodes) == [9]
    assert "the publisher restarted 1×" in view.status()


def test_the_subscriber_follows_a_restart_and_counts_what_it_cannot_read():
    with _publisher_and_subscriber() as (pub, sub):

        def send(seq: int, hashes: list[int]) -> None:
            payload = msgspec.msgpack.encode([0.0, [_stored(hashes, None, [1, 2, 3, 4] * len(hashes))]])
            pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

        got = _until_received(sub, lambda: send(0, [100]))  # (then the subscription has reached the socket)
        for seq in range(1, 3):
            send(seq, [100 + seq])
        pub.send_multipart([b"", (3).to_bytes(8, "big"), b"\xc1 not msgpack"])
        pub.send_multipart([b"only one frame"])
        for seq in range(2):  # a restarted server: from 0 again
            send(seq, [200 + seq])
        got = _receive(sub, got, 5)
        assert [seq for seq, _, _ in got] == [0, 1, 2, 0, 1]
        assert sub.skipped == 2
    view = PrefixCacheView()
    for seq, ts, events in got:
        view.apply(seq, ts, events)
    assert view.restarts == 1 and sorted(view.nodes) == [200, 201]


def test_attach_options_out_of_range_are_refused_before_it_prints_anything(capsys):
    assert cli_main(["attach", DEFAULT_ENDPOINT, "--duration", "1", "--topic", "\udcff"]) == 2
    assert "--topic is not valid UTF-8" in capsys.readouterr().err
    for lines in ("-2", "100000000000000000000"):  # (checked at the end, after the session)
        assert cli_main(["attach", DEFAULT_ENDPOINT, "--duration", "1", "--lines", lines]) == 2
        out = capsys.readouterr()
        assert f"--lines must be from 0 to 1,000,000; got {lines}" in out.err and out.out == ""


@pytest.mark.parametrize(("bound", "header"), [(["--duration", "60"], "until 60 s"), ([], "until Ctrl-C")])
def test_ctrl_c_during_attach_still_prints_what_was_received(bound, header):
    # (with no bound it follows the stream as tail -f does: Ctrl-C ends it)
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "pagesim.app.cli", "attach", f"tcp://127.0.0.1:{free_port()}", *bound],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        line = proc.stdout.readline()  # the header: it is listening
        while "until" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130 and header in line  # (the header's second line, read above)
    assert "interrupted: what was received until then" in err and "Traceback" not in err
    assert "0 batches, 0 events" in out and "prefix cache: empty" in out


def test_a_publishing_endpoint_zeromq_would_bend_or_no_one_could_reach_is_refused(capsys):
    """Port 99999 was bound as 34463 (modulo 65536); inproc:// reaches no other process."""
    for endpoint, said in (
        ("tcp://127.0.0.1:99999", "a port from 1 to 65535"),
        ("inproc://x", "inproc:// reaches no other process"),
        ("127.0.0.1:5557", "is not a ZeroMQ endpoint"),
    ):
        assert cli_main(["run", "seed_demo", "--quiet", "--kv-events", endpoint]) == 2
        assert said in capsys.readouterr().err
    assert cli_main(["run", "seed_demo", "--quiet", "--kv-events", "tcp://127.0.0.1:*", "--kv-events-topic",
                     "\udcff"]) == 2  # fmt: skip
    assert "--kv-events-topic is not valid UTF-8" in capsys.readouterr().err


def test_an_ipc_endpoint_over_a_users_file_is_refused_and_the_socket_goes_when_done(tmp_path, capsys):
    """ZeroMQ deletes what an ipc path holds to bind: 'run X.toml --kv-events ipc://X.toml'
    turned the scenario into a socket, printed PASS and exited 0."""
    scenario = tmp_path / "mine.toml"
    scenario.write_text(scenario_file(token_model("seed_demo")).read_text())
    before = scenario.read_bytes()
    assert cli_main(["run", str(scenario), "--quiet", "--kv-events", f"ipc://{scenario}"]) == 2
    assert "is an existing file, not a socket, and binding would delete it" in capsys.readouterr().err
    assert scenario.read_bytes() == before
    missing = tmp_path / "no" / "sock"
    assert cli_main(["run", str(scenario), "--quiet", "--kv-events", f"ipc://{missing}"]) == 2
    assert "does not exist" in capsys.readouterr().err
    sock = tmp_path / "kv.sock"
    args = ["run", str(scenario), "--quiet", "--kv-events", f"ipc://{sock}", "--kv-events-linger", "0"]
    assert cli_main(args) == 0 and not sock.exists()  # (the socket's file is removed on close)
    # Another program's live socket is not taken over; the same path for both sockets is refused.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other:
        other.bind(str(sock))
        other.listen(1)
        assert cli_main(args) == 2
        assert "another program is listening on" in capsys.readouterr().err and sock.is_socket()
    twice = [*args, "--kv-events-replay", f"ipc://{sock}"]
    assert cli_main(twice) == 2 and "name the same endpoint" in capsys.readouterr().err
    assert cli_main([*args[:-4], "--kv-events", "ipc://~/kv.sock"]) == 2
    assert "ZeroMQ does not expand ~" in capsys.readouterr().err


def test_a_run_that_fails_midway_closes_its_publisher_and_removes_its_socket(tmp_path, monkeypatch, capsys):
    from pagesim.app import cli

    def full_disk(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli, "dump_step", full_disk)
    sock = tmp_path / "kv.sock"
    argv = ["run", "seed_demo", "--quiet", "--kv-events", f"ipc://{sock}", "--kv-events-linger", "0"]
    assert cli_main([*argv, "--dump", str(tmp_path / "d")]) == 1
    assert "--dump" in capsys.readouterr().err and not sock.exists()


def test_blocks_whose_parents_loop_back_are_still_drawn():
    """Store 1→2, remove 1, store 1 again under 2: both cached, neither reached from a root."""
    view = PrefixCacheView()
    view.apply(0, 0.0, [_stored([1, 2], None, [1, 2, 3, 4, 5, 6, 7, 8])])
    view.apply(1, 0.0, [{"type": "BlockRemoved", "block_hashes": [1]}, _stored([1], 2, [1, 2, 3, 4])])
    runs = list(view.runs())
    assert view.cached_blocks == 2 and sorted(h for run in runs for h in run.hashes) == [1, 2]


def test_attach_to_a_silent_endpoint_says_what_a_server_needs_and_refuses_inproc(monkeypatch, capsys):
    """With --max-events it waited for ever, silently; with --duration it said only 'prefix
    cache: empty'. inproc:// was accepted though it reaches no other process."""
    from pagesim.app import kv_attach

    monkeypatch.setattr(kv_attach, "HINT_AFTER_S", 0.3)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    assert cli_main(["attach", endpoint, "--duration", "1", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"note: nothing from {endpoint} in 0.3 s: is the server running with prefix caching" in err
    assert f"note: no KV events came from {endpoint}" in err and "--kv-events-config" in err
    assert cli_main(["attach", "inproc://x", "--duration", "1"]) == 2
    assert "inproc:// reaches no other process" in capsys.readouterr().err


def test_batches_the_sequence_numbers_skip_are_counted_and_said_missed():
    """Numbers 0, 1000, 2000 … with no replay: the summary said nothing of the 998 batches lost."""
    with _publisher_and_subscriber() as (pub, sub):

        def send(seq: int) -> None:
            payload = msgspec.msgpack.encode([0.0, [_stored([seq], None, [1, 2, 3, 4])]])
            pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])

        got = _until_received(sub, lambda: send(5))  # (from 5: what came before attaching is no gap)
        for seq in (6, 1000, 2000):
            send(seq)
        got = _receive(sub, got, 4)
        assert [seq for seq, _, _ in got] == [5, 6, 1000, 2000] and sub.missed == 993 + 999
    view = PrefixCacheView()
    view.missed_batches = sub.missed
    assert any(p.startswith("1992 batches missed") for p in view.problems())


def test_publisher_options_are_refused_before_the_scenario_loads(capsys):
    """They were checked after the scenario (a real model: seconds) had loaded and its header printed."""
    for extra, said in (
        (["--kv-events-replay", "tcp://127.0.0.1:5558"], "--kv-events-replay needs --kv-events"),
        (["--kv-events-topic", "kv"], "--kv-events-topic needs --kv-events"),  # (it was ignored)
        (["--kv-events-linger", "5"], "--kv-events-linger needs --kv-events"),
        (["--kv-events", "tcp://127.0.0.1:*", "--kv-events-linger", "900"], "--kv-events-linger must be between"),
    ):
        assert cli_main(["run", "default", *extra]) == 2
        out = capsys.readouterr()
        assert said in out.err and "pagesim run ·" not in out.out


def test_a_restart_whose_first_number_is_the_last_one_seen_is_followed():
    """A publisher that sent only #0, then a new one from #0: the new #0 was dropped as a
    repeat, the two runs' prompts mixed in one tree, no restart said."""
    with _publisher_and_subscriber() as (pub, sub):
        first = msgspec.msgpack.encode([0.0, [_stored([100], None, [1, 2, 3, 4])]])
        second = msgspec.msgpack.encode([0.0, [_stored([200], None, [5, 6, 7, 8])]])
        got = _until_received(sub, lambda: pub.send_multipart([b"", (0).to_bytes(8, "big"), first]))
        for payload in (first, second):  # (the same #0 again is a repeat; another #0 a restart)
            pub.send_multipart([b"", (0).to_bytes(8, "big"), payload])
        got = _receive(sub, got, 2)
    assert [seq for seq, _, _ in got] == [0, 0]
    view = PrefixCacheView()
    for seq, ts, events in got:
        view.apply(seq, ts, events)
    assert view.restarts == 1 and list(view.nodes) == [200]
