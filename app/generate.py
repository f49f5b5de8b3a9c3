"""``pagesim generate``: a prompt through a real model inside the paged engine, greedy or
sampled (temperature, top-k, top-p, a seed), the text streamed as it comes; then the
sequence's block table, and each token's verdict: the paged path's logits it was chosen
from against the dense engine's (and the same token drawn from both).

Imported only by that command (it loads torch and the model)."""

from __future__ import annotations

import argparse
import os
import statistics
import sys

from pagesim.app.options import json_text, say_unused_cuda_kernel, writable_problem
from pagesim.core.checks import utf8_error
from pagesim.core.engine import Simulator
from pagesim.core.errors import InvalidOperationError
from pagesim.core.language_model import real_model_problem
from pagesim.core.models.catalog import config_for_model, load_model
from pagesim.core.models.precision import DTYPE_ENV, describe_dtype, resolve_dtype
from pagesim.core.models.threads import apply_chosen_threads
from pagesim.core.operations import Add, Grow
from pagesim.core.sampling import SamplingParams
from pagesim.kernels.selection import select_backend

SEQ = "0"


def _verdict(step: int, token: int, check, attention) -> dict:
    return {
        "step": step,
        "token": token,
        "paged_token": check.paged_token,
        "dense_token": check.dense_token,
        "max_abs_logit_diff": check.max_abs_diff,
        "tolerance": check.tolerance,
        "attention_max_abs_error": attention.max_abs_error,
        "attention_passed": attention.passed,
        "passed": check.passed and check.paged_token == token and attention.passed,
    }


def cmd_generate(args: argparse.Namespace, write_output) -> int:
    """``write_output(path, text, option)``: how the report is written (a failure, one line)."""
    for option, value in (("--max-tokens", args.max_tokens), ("--block-size", args.block_size)):
        if value < 1:
            raise InvalidOperationError(f"{option} must be a positive integer; got {value}")
    if args.json is not None and (reason := writable_problem(args.json, "--json")):
        print(f"error: {reason}", file=sys.stderr)
        return 2
    if (at := utf8_error(args.prompt)) is not None:
        raise InvalidOperationError(f"the prompt is not valid UTF-8 text (at character {at})")
    if (problem := real_model_problem(args.model, "--model")) is not None:
        raise InvalidOperationError(problem)
    sampling = SamplingParams(args.temperature, args.top_k, args.top_p, args.seed, args.max_tokens)
    stream = args.json is None or str(args.json) != "-"
    if args.dtype is not None:
        os.environ[DTYPE_ENV] = args.dtype  # every load of the model in this run (config, runner) agrees
    dtype, why = resolve_dtype()
    threads = apply_chosen_threads()
    model = load_model(args.model)
    tok = model.tokenizer
    messages = [{"role": "user", "content": args.prompt}]
    prompt = tok.encode_chat(messages) if args.chat else tok.encode(args.prompt)
    if not prompt:
        raise InvalidOperationError("the prompt is empty")
    window = model.config.context_length
    if len(prompt) >= window:
        raise InvalidOperationError(
            f"the prompt alone is {len(prompt)} tokens, past the model's context window of {window}: shorten it"
        )
    if len(prompt) + args.max_tokens > window:  # (positions past it were never trained: the text degrades)
        raise InvalidOperationError(
            f"{len(prompt)} prompt tokens + --max-tokens {args.max_tokens} pass the model's context window of "
            f"{window} tokens: at most --max-tokens {max(window - len(prompt), 0)}"
        )
    blocks = -(-(len(prompt) + args.max_tokens) // args.block_size)
    config = config_for_model(args.model, num_blocks=blocks, block_size=args.block_size)
    backend = select_backend(args.backend, args.cuda_kernel)
    say_unused_cuda_kernel(args, backend)
    sim = Simulator(config, backend)
    if stream:
        name = model.config.name or model.path.name
        print(f"{name} · {describe_dtype(dtype)} ({why}) · {threads} · {sim.runner.device}\n")
    result = sim.apply(Add(SEQ, prompt=prompt, sampling=sampling))
    runner = sim.runner
    pending, attention = runner.logits_checks[0], result.attention  # what the first token is chosen from
    steps, output, shown = [], [], ""
    paged_seconds, dense_seconds = [], []
    for step in range(1, args.max_tokens + 1):
        result = sim.apply(Grow(SEQ))
        token = sim.sequence(SEQ).token_ids[-1]
        output.append(token)
        steps.append(_verdict(step, token, pending, attention))
        pending, attention = runner.logits_checks[0], result.attention
        paged_seconds.append(runner.paged_seconds)
        dense_seconds.append(runner.dense_seconds)
        text = tok.decode(output, skip_special=True)
        if stream and not text.endswith("\ufffd"):  # (a character whose bytes are not all out yet)
            sys.stdout.write(text[len(shown) :])
            sys.stdout.flush()
            shown = text
        if token == model.config.eos_id or len(output) >= args.max_tokens:
            break
    text = tok.decode(output, skip_special=True)
    passed = all(s["passed"] for s in steps)
    seq = sim.sequence(SEQ)
    worst = max(s["max_abs_logit_diff"] for s in steps)
    paged_ms, dense_ms = (1e3 * statistics.median(t) for t in (paged_seconds, dense_seconds))
    if stream:
        sys.stdout.write(text[len(shown) :] + "\n\n")
        where = f"{seq.num_tokens} tokens, block size {args.block_size}"
        print(f"block table of sequence {SEQ} ({where}): {seq.block_table}")
        mark = "✓" if passed else "✗ MISMATCH"
        how = "greedy token" if sampling.greedy else f"token drawn with seed {sampling.seed}"
        print(
            f"{len(output)} tokens; paged vs dense logits: max |diff| {worst:.1e} (bound {pending.tolerance:.0e}), "
            f"the same {how} every step {mark}; a decode step: paged {paged_ms:.0f} ms, dense {dense_ms:.0f} ms"
        )
    if args.json is not None:
        report = {
            "model": args.model,
            "dtype": dtype,
            "threads": threads,
            "prompt": args.prompt,
            "chat": args.chat,
            "sampling": {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed},
            "prompt_token_ids": prompt,
            "output_token_ids": output,
            "text": text,
            "block_table": list(seq.block_table),
            "block_size": args.block_size,
            "passed": passed,
            "decode_ms": {"paged": paged_ms, "dense": dense_ms},
            "steps": steps,
        }
        write_output(args.json, json_text(report), "--json")
    return 0 if passed else 1
