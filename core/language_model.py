"""What the engine asks of a model, whichever it is: the synthetic token model (seeded
projections, token ids from a hash) or a real language model run by the Llama runner.

The registry, the engine and the schedulers talk to this interface only: the ids of a
prompt given as a count (``token_ids``), the next token of each sequence in a decode step
(``next_token_ids``: a hash for the synthetic model, a choice from the sequence's last
logits for a real one, under the sequence's sampling parameters), the end-of-sequence token
and the vocabulary's bounds. How K/V are computed and cached is the runner's business.
"""

from __future__ import annotations

from typing import Protocol

from pagesim.core.errors import InvalidOperationError
from pagesim.core.sampling import SamplingParams

SYNTHETIC = "synthetic"
BUNDLED_MODEL = "smollm2-135m"  # SmolLM2-135M-Instruct, installed with pagesim (core.models.catalog)


class LanguageModel(Protocol):
    name: str  # "synthetic", or the real model's name
    vocab_size: int
    # True: next tokens come from the sequence's logits, so a grow by N decodes N steps
    # one token at a time (each token's logits are needed for the next one).
    samples_from_logits: bool
    eos_id: int | None  # the end-of-sequence token (None: the model has none)
    context_window: int | None  # the most tokens a sequence may hold (None: no bound, the synthetic model)

    def token_ids(self, seq_id: str, start: int, count: int) -> list[int]:
        """Filler ids for a prompt given as a count: stable across runs."""
        ...

    def next_token_ids(
        self, seq_ids: list[str], positions: list[int], sampling: list[SamplingParams | None] | None = None
    ) -> list[int]:
        """One token per sequence (a decode step); ``sampling``: each sequence's parameters
        (a real model's choice; the synthetic model ignores them)."""
        ...

    def check_vocab(self, token_ids, field: str) -> None:
        """Refuse ids outside the vocabulary, naming the field."""
        ...


def check_vocab(token_ids, field: str, vocab_size: int) -> None:
    """Refuse token ids outside ``[0, vocab_size)``, naming the field."""
    if not token_ids or (min(token_ids) >= 0 and max(token_ids) < vocab_size):
        return
    bad = next(t for t in token_ids if not 0 <= t < vocab_size)
    raise InvalidOperationError(f"{field}: token id {bad} is outside the vocabulary [0, {vocab_size})")


def window_passed(model: LanguageModel, length: int) -> int | None:
    """``model``'s context window when a sequence of ``length`` tokens passes it (positions
    it was never trained on; vLLM's max_model_len defaults to it), else None."""
    window = model.context_window
    return window if window is not None and length > window else None


def request_past_window(model: LanguageModel, prompt_len: int, output_len: int) -> str | None:
    """Why a request of ``prompt_len`` + ``output_len`` tokens is rejected as submitted:
    it passes ``model``'s context window (either scheduler's refusal), or None."""
    if window := window_passed(model, prompt_len + output_len):
        return f"{prompt_len} prompt + {output_len} output tokens pass the model's context window of {window}"
    return None


def real_model_problem(name: str, option: str) -> str | None:
    """Why ``name``, given to ``option``, is no real model to load (the synthetic one has no
    weights or tokenizer), or None; said before anything loads."""
    if name == BUNDLED_MODEL or name.lower().endswith(".gguf"):
        return None
    if name == "synthetic":
        return f'{option} synthetic: the synthetic token model has no weights or tokenizer; give "{BUNDLED_MODEL}"'
    return f'{option} {name!r} is not a model: give "{BUNDLED_MODEL}" (bundled) or a path to a .gguf file'
