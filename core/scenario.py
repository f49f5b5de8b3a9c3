"""Scenarios: a cache configuration and a list of operations, in user-editable TOML.

::

    name = "Two sequences on scattered blocks"
    num_blocks = 8
    block_size = 4
    num_heads = 2
    head_dim = 8

    [[steps]]
    op = "add"
    seq = 0
    tokens = 10
    blocks = [0, 3, 5]
"""

from __future__ import annotations

import os
import stat
import tomllib
from dataclasses import dataclass, fields, replace
from importlib import resources
from pathlib import Path

from pagesim.core.checks import all_ints, is_count, is_int
from pagesim.core.config import CacheConfig, other_engines_field
from pagesim.core.errors import InvalidOperationError, PagesimError, ScenarioError
from pagesim.core.language_model import SYNTHETIC
from pagesim.core.operations import Add, Fork, Free, Grow, Operation, Schedule, Submit
from pagesim.core.sampling import SamplingParams

HEADER_FIELDS = {f.name for f in fields(CacheConfig)}
REQUIRED_HEADER = ("num_blocks", "block_size", "num_heads", "head_dim")
TEXT_FIELDS = ("name", "description")
# How a real model picks tokens (core.sampling; the synthetic model ignores them).
SAMPLING_FIELDS = {"temperature", "top_k", "top_p", "seed", "max_tokens", "length_penalty"}
STEP_FIELDS = {
    "add": {"seq", "tokens", "prompt", "messages", "blocks"} | SAMPLING_FIELDS,
    "grow": {"seq", "tokens", "token_ids"},
    "fork": {"seq", "as"},
    "free": {"seq"},
    "submit": {"request", "tokens", "prompt", "messages", "output", "n", "beam_width", "shared_prefix"}
    | SAMPLING_FIELDS,
    "schedule": {"steps"},
}
DEFAULT_SCENARIO = "default"
# A learner's path through the shipped scenarios: the idea, the tour, sharing, prefix
# caching, running out of memory, long contexts; then the rest.
SUGGESTED_ORDER = (
    "seed_demo",
    "default",
    "parallel_sampling",
    "shared_system_prompt",
    "prefix_caching_v1",
    "preemption_recompute",
    "preemption_swap",
    "preemption_v1",
    "long_context",
    "beam_search",
    "worst_case_fragmentation",
    "stress",
)
MAX_NOTE_CHARS = 600  # a step's narration: a few sentences


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    config: CacheConfig
    operations: tuple[Operation, ...]
    source: str = "<memory>"
    notes: tuple[str, ...] = ()  # narration per step ("" for none), from each step's ``note``
    # A real model's context window (None: the synthetic model's, unbounded), kept when the
    # synthetic model stands in for it in a study's replay
    context_window: int | None = None

    def summary(self, max_chars: int = 100) -> str:
        """The description's first sentence on one line, shortened with "…" past ``max_chars``."""
        return first_sentence(self.description, max_chars)

    def note(self, index: int) -> str:
        """The narration of operation ``index`` (0-based), or ""."""
        return self.notes[index] if 0 <= index < len(self.notes) else ""

    def to_toml(self) -> str:
        import tomli_w  # only saving needs it

        doc: dict = {"name": self.name, "description": self.description}
        for f in fields(CacheConfig):
            if other_engines_field(f.name, self.config.scheduler) is None:  # (the other engine's: refused on load)
                doc[f.name] = getattr(self.config, f.name)
        # One [[steps]] table per operation, the way people write them by hand.
        steps = "".join(
            f"\n[[steps]]\n{tomli_w.dumps(operation_to_dict(op) | ({'note': note} if note else {}))}"
            for op, note in zip(self.operations, (self.note(i) for i in range(len(self.operations))), strict=True)
        )
        return tomli_w.dumps(doc, multiline_strings=True) + steps

    def with_operations(self, operations) -> Scenario:
        """The same scenario with other operations; a note stays with its step while the
        operations up to it are still the script's."""
        operations = tuple(operations)
        notes = []
        for index, op in enumerate(operations):
            if index >= len(self.operations) or self.operations[index] != op:
                break
            notes.append(self.note(index))
        return replace(self, operations=operations, notes=tuple(notes))


def sampling_to_dict(sampling: SamplingParams | None) -> dict:
    """The sampling fields that differ from the defaults (greedy, no limit)."""
    if sampling is None:
        return {}
    return {
        name: getattr(sampling, name)
        for name in ("temperature", "top_k", "top_p", "seed", "max_tokens", "length_penalty")
        if getattr(sampling, name) != getattr(SamplingParams(), name)
    }


def operation_to_dict(op: Operation) -> dict:
    if isinstance(op, Add):
        out = {"op": "add", "seq": op.seq}
        out.update({"tokens": op.num_tokens} if op.prompt is None else {"prompt": list(op.prompt)})
        if op.blocks is not None:
            out["blocks"] = list(op.blocks)
        return out | sampling_to_dict(op.sampling)
    if isinstance(op, Grow):
        if op.token_ids is not None:
            return {"op": "grow", "seq": op.seq, "token_ids": list(op.token_ids)}
        return {"op": "grow", "seq": op.seq, "tokens": op.num_tokens}
    if isinstance(op, Fork):
        return {"op": "fork", "seq": op.seq, "as": op.new_seq}
    if isinstance(op, Submit):
        out = {"op": "submit", "request": op.request, "output": op.output_len}
        out.update({"tokens": op.prompt_len} if op.prompt is None else {"prompt": list(op.prompt)})
        for name, default in (("n", 1), ("beam_width", 0), ("shared_prefix", 0)):
            if getattr(op, name) != default:
                out[name] = getattr(op, name)
        return out | sampling_to_dict(op.sampling)
    if isinstance(op, Schedule):
        return {"op": "schedule", "steps": op.steps}
    return {"op": "free", "seq": op.seq}


def _seq_name(value, source: str, step: int, field: str) -> str:
    # TOML lets users write seq = 0; names are strings inside the engine.
    if not (is_int(value) or isinstance(value, str)) or value == "":
        raise ScenarioError(source, f"must be a sequence name (string or integer); got {value!r}", step, field)
    return str(value)


def _int_list(value, source: str, step: int, field: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all_ints(value):
        raise ScenarioError(source, f"must be a list of integers; got {value!r}", step, field)
    return tuple(value)


def parse_step(raw: dict, source: str, step: int) -> Operation:
    """One [[steps]] table as an operation. The TOML's shape (known fields, names, lists)
    is checked here; what the values must be, by the operation itself."""
    if not isinstance(raw, dict):
        raise ScenarioError(source, "each [[steps]] entry must be a table", step)
    op = raw.get("op")
    if not isinstance(op, str) or op not in STEP_FIELDS:  # (a table or array is no key of the dict)
        raise ScenarioError(source, f"op must be one of {', '.join(STEP_FIELDS)}; got {op!r}", step, "op")
    unknown = sorted(set(raw) - STEP_FIELDS[op] - {"op"})
    if unknown:
        allowed = ", ".join(sorted(STEP_FIELDS[op]))
        raise ScenarioError(source, f"unknown field for op {op!r} (allowed: {allowed})", step, unknown[0])
    if op == "submit" and "max_tokens" in raw:  # vLLM's name for a request's output length
        if "output" in raw:
            raise ScenarioError(source, "give output or max_tokens (the same thing), not both", step, "max_tokens")
        if not is_count(raw["max_tokens"]):
            got = raw["max_tokens"]
            raise ScenarioError(source, f"max_tokens must be a positive integer; got {got!r}", step, "max_tokens")
        raw = {k: v for k, v in raw.items() if k != "max_tokens"} | {"output": raw["max_tokens"]}
    required = {"schedule": (), "submit": ("request", "output"), "fork": ("seq", "as")}.get(op, ("seq",))
    for name in required:
        if name not in raw:
            what = {
                "as": "the forked sequence's name",
                "request": "the request's name",
                "output": "how many tokens to decode",
            }
            raise ScenarioError(source, f"missing: {what[name]}" if name in what else "missing", step, name)

    def ids(name: str) -> tuple[int, ...] | None:
        return _int_list(raw[name], source, step, name) if name in raw else None

    try:
        sampling = None
        if SAMPLING_FIELDS & set(raw):
            sampling = SamplingParams(**{name: raw[name] for name in SAMPLING_FIELDS if name in raw})
        if op == "schedule":
            return Schedule(raw.get("steps", 1))
        if op == "submit":
            request = _seq_name(raw["request"], source, step, "request")
            submit = Submit(
                request,
                raw["output"],
                raw.get("tokens"),
                ids("prompt"),
                raw.get("n", 1),
                raw.get("beam_width", 0),
                raw.get("shared_prefix", 0),
                sampling,
            )
            # The engine clamps a longer shared prefix to the prompt; in a file it is a mistake.
            if submit.shared_prefix > submit.length:
                raise ScenarioError(
                    source,
                    f"shared_prefix ({submit.shared_prefix}) is longer than the prompt ({submit.length} tokens): "
                    "the shared system prompt is part of the prompt",
                    step,
                    "shared_prefix",
                )
            return submit
        seq = _seq_name(raw["seq"], source, step, "seq")
        if op == "add":
            return Add(seq, raw.get("tokens"), ids("prompt"), ids("blocks"), sampling)
        if op == "grow":
            return Grow(seq, raw.get("tokens"), ids("token_ids"))
        if op == "fork":
            return Fork(seq, _seq_name(raw["as"], source, step, "as"))
        return Free(seq)
    except InvalidOperationError as exc:
        raise ScenarioError(source, str(exc), step, exc.field) from None


def parse_scenario(text: str, source: str = "<memory>") -> Scenario:
    if text.startswith("\ufeff"):
        raise ScenarioError(source, "starts with a UTF-8 byte-order mark (BOM): save it as UTF-8 without a BOM")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(source, f"not valid TOML: {exc}") from None
    except RecursionError:
        raise ScenarioError(source, "not valid TOML: arrays or tables nested too deeply") from None
    unknown = sorted(set(doc) - HEADER_FIELDS - set(TEXT_FIELDS) - {"steps"})
    if unknown:
        raise ScenarioError(
            source, f"unknown header field (allowed: {', '.join(sorted(HEADER_FIELDS))})", None, unknown[0]
        )
    header = {k: v for k, v in doc.items() if k in HEADER_FIELDS}
    tokenizer, window = _real_model(header, source)  # (None, None): the synthetic model
    for name in REQUIRED_HEADER:
        if name not in header:
            raise ScenarioError(source, "missing from the header", None, name)
    for name in TEXT_FIELDS:
        if not isinstance(doc.get(name, ""), str):
            raise ScenarioError(source, "must be a string", None, name)
    scheduler = header.get("scheduler", "v0")
    for name in header if scheduler in ("v0", "v1") else ():  # (another value: CacheConfig says so)
        if (problem := other_engines_field(name, scheduler)) is not None:
            raise ScenarioError(source, problem, None, name)
    try:
        config = CacheConfig(**header)
    except ValueError as exc:
        field = next((name for name in header if str(exc).startswith(name)), None)
        raise ScenarioError(source, str(exc), None, field) from None
    steps = doc.get("steps", [])
    if not isinstance(steps, list):
        raise ScenarioError(source, "must be an array of tables ([[steps]])", None, "steps")
    operations, notes = [], []
    for number, raw in enumerate(steps, start=1):
        if isinstance(raw, dict) and "note" in raw:
            raw = dict(raw)
            note = raw.pop("note")
            if not isinstance(note, str) or len(note) > MAX_NOTE_CHARS:
                raise ScenarioError(source, f"must be a string of at most {MAX_NOTE_CHARS} characters", number, "note")
            notes.append(" ".join(note.split()))
        else:
            notes.append("")
        if isinstance(raw, dict):
            raw = _text_prompt(raw, tokenizer, source, number)
        try:
            operations.append(parse_step(raw, source, number))
        except ScenarioError:
            raise
        except PagesimError as exc:
            raise ScenarioError(source, str(exc), number) from None
    name = doc.get("name") or Path(source).stem
    return Scenario(name, doc.get("description", ""), config, tuple(operations), source, tuple(notes), window)


def first_sentence(text: str, max_chars: int = 100) -> str:
    """``text``'s first sentence on one line, shortened with "…" past ``max_chars``."""
    first = " ".join(text.split()).split(". ")[0].rstrip(".")
    return first if len(first) <= max_chars else first[: max_chars - 1].rstrip() + "…"


def _text_prompt(raw: dict, tokenizer, source: str, number: int) -> dict:
    """A step's prompt given as text (``prompt = "…"``) or as chat ``messages`` (rendered
    by the model's chat template), as token ids; other steps unchanged."""
    text, messages = isinstance(raw.get("prompt"), str), "messages" in raw
    if not (text or messages):
        return raw
    field = "messages" if messages else "prompt"
    if tokenizer is None:
        needs = f'{field} as text needs a real model in the header (model = "smollm2-135m")'
        raise ScenarioError(source, needs, number, field)
    if messages and "prompt" in raw:
        raise ScenarioError(source, "give prompt or messages, not both", number, "messages")
    if text:
        return dict(raw, prompt=tokenizer.encode(raw["prompt"]))
    chat = raw["messages"]
    well_formed = (
        isinstance(chat, list)
        and chat
        and all(
            isinstance(m, dict) and set(m) == {"role", "content"} and all(isinstance(v, str) for v in m.values())
            for m in chat
        )
    )
    if not well_formed:
        shape = 'a non-empty array of {role = "…", content = "…"} tables'
        raise ScenarioError(source, f"must be {shape}", number, "messages")
    try:
        ids = tokenizer.encode_chat(chat)
    except PagesimError as exc:
        raise ScenarioError(source, str(exc), number, "messages") from None
    out = {k: v for k, v in raw.items() if k != "messages"}
    return dict(out, prompt=ids)


def _real_model(header: dict, source: str):
    """For ``model = "smollm2-135m"`` or ``"PATH.gguf"`` (a relative path is looked up
    beside the scenario file first): load it, fill in the shape fields it sets (refusing
    one that contradicts it, by name) and return its tokenizer and context window. (None,
    None) for the synthetic model."""
    name = header.get("model", SYNTHETIC)
    if not isinstance(name, str) or name == SYNTHETIC:
        return None, None
    # Lazy on purpose: torch and the model file load only for a scenario that names a real model.
    from pagesim.core.models.catalog import ModelMismatchError, check_shapes, load_model, model_shapes

    beside = Path(source).parent / name
    if name.lower().endswith(".gguf") and not Path(name).is_absolute() and beside.exists():
        name = header["model"] = str(beside)
    try:
        model = load_model(name)
        check_shapes(header, model.config, name)
    except ModelMismatchError as exc:
        raise ScenarioError(source, str(exc), None, exc.field) from None
    except PagesimError as exc:
        raise ScenarioError(source, str(exc), None, "model") from None
    header.update(model_shapes(model.config))
    return model.tokenizer, model.config.context_length


MAX_SCENARIO_BYTES = 16 * 2**20  # a scenario is a page or two of TOML; this is far past any real one


def read_scenario_text(path: str | Path, what: str = "scenario file", text_format: str = "TOML") -> str:
    """The text of a scenario file (or another input of the kind ``what`` names, written in
    ``text_format``): a regular file of at most :data:`MAX_SCENARIO_BYTES`, in UTF-8. A FIFO,
    a device (``/dev/zero``, ``/dev/urandom``) or a folder is refused without reading from
    it (opened non-blocking, so a FIFO with no writer cannot hang)."""
    source = str(path)
    if not source:  # (Path("") is the current folder)
        raise ScenarioError("''", f"an empty name: give a {what}'s path")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ScenarioError(source, f"cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ScenarioError(source, f"cannot read: it is a folder, not a {what}")
        if not stat.S_ISREG(st.st_mode):
            raise ScenarioError(source, "cannot read: not a regular file (a pipe, a device or a socket)")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        if st.st_size > MAX_SCENARIO_BYTES:
            raise ScenarioError(
                source, f"too large: {st.st_size:,} bytes (a {what} holds at most {MAX_SCENARIO_BYTES:,})"
            )
        try:
            data = f.read(MAX_SCENARIO_BYTES + 1)
        except OSError as exc:
            raise ScenarioError(source, f"cannot read: {exc.strerror}") from None
    if len(data) > MAX_SCENARIO_BYTES:  # it grew while being read
        raise ScenarioError(source, f"too large: more than {MAX_SCENARIO_BYTES:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            source,
            f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}): is it a {text_format} file?",
        ) from None


def load_scenario(path: str | Path) -> Scenario:
    """Load a scenario file, or a shipped one by name (``default``, ``seed_demo``, ...).
    A shipped name wins over a local path of that name that is not a regular file (a
    folder called ``default`` in the current directory)."""
    if not str(path):  # (Path("") is the current folder)
        raise ScenarioError("''", "an empty name: give a shipped scenario's name (pagesim scenarios) or a file's path")
    path = Path(path)
    if _is_shipped_name(path):
        return load_shipped(str(path))
    try:
        text = read_scenario_text(path)
    except ScenarioError as exc:
        if (meant := _shipped_name_like(str(path))) is None or not _missing(path):
            raise
        raise ScenarioError(
            str(path), f"no such file; did you mean the shipped scenario {meant!r}? (pagesim scenarios lists them)"
        ) from exc
    return parse_scenario(text, str(path))


def _missing(path: Path) -> bool:
    """Nothing is at ``path`` (not: a folder above it may not be entered)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


def _shipped_name_like(name: str) -> str | None:
    """The shipped scenario a name that is no file was likely meant to be (``Seed-Demo``,
    ``seed_demo.toml``), or None."""
    key = name.lower().removesuffix(".toml").replace("-", "_").replace(" ", "_")
    return key if key in shipped_scenarios() else None


def _is_shipped_name(path: Path) -> bool:
    return path.suffix == "" and str(path) in shipped_scenarios() and not path.is_file()


def scenario_file(path: str | Path) -> Path:
    """The file :func:`load_scenario` reads for ``path``: a shipped name's own file, else ``path``."""
    path = Path(path)
    if _is_shipped_name(path):
        return Path(str(resources.files("pagesim.assets") / "scenarios" / f"{path}.toml"))
    return path


def scenario_model(path: str | Path) -> str | None:
    """The real model a scenario file (or a shipped one, by name) runs, as ``load_model``
    takes it, read from its header alone (None: the synthetic model, or a file that does
    not say: parsing it tells why). Cheap: the app loads the model before parsing."""
    path = scenario_file(path)
    try:
        name = tomllib.loads(read_scenario_text(path)).get("model", SYNTHETIC)
    except (PagesimError, tomllib.TOMLDecodeError, RecursionError, OSError):
        return None
    if not isinstance(name, str) or name == SYNTHETIC:
        return None
    beside = path.parent / name
    if name.lower().endswith(".gguf") and not Path(name).is_absolute() and beside.exists():
        return str(beside)
    return name


def shipped_scenarios() -> dict[str, str]:
    """Shipped scenario name -> its file name."""
    folder = resources.files("pagesim.assets") / "scenarios"
    return {p.name.removesuffix(".toml"): p.name for p in folder.iterdir() if p.name.endswith(".toml")}


@dataclass(frozen=True)
class Example:
    """A shipped scenario as a list of them shows it: its header's text alone."""

    name: str  # the shipped name, as load_shipped takes it
    title: str
    description: str
    steps: int = 0  # its [[steps]] (one operation each)
    model: str = SYNTHETIC  # the model its header names

    def summary(self, max_chars: int = 100) -> str:
        """As :meth:`Scenario.summary` says it."""
        return first_sentence(self.description, max_chars)


def examples() -> list[Example]:
    """Every shipped scenario, in the suggested order (any not listed there last). Read from
    the headers alone: parsing a real-model scenario loads its model (seconds, and the
    first time minutes of dequantising), which a list of names must not wait for."""
    shipped = shipped_scenarios()
    names = [n for n in SUGGESTED_ORDER if n in shipped]
    names += sorted(set(shipped) - set(names))
    folder = resources.files("pagesim.assets") / "scenarios"
    out = []
    for name in names:
        doc = tomllib.loads((folder / shipped[name]).read_text(encoding="utf-8"))
        steps = doc.get("steps", [])
        out.append(
            Example(name, doc.get("name") or name, doc.get("description", ""), len(steps), doc.get("model", SYNTHETIC))
        )
    return out


def shipped_folder() -> Path | None:
    """Where the shipped scenario files are on disk (None inside a zipped install)."""
    folder = resources.files("pagesim.assets") / "scenarios"
    return Path(str(folder)) if Path(str(folder)).is_dir() else None


def load_shipped(name: str) -> Scenario:
    resource = resources.files("pagesim.assets") / "scenarios" / f"{name}.toml"
    with resources.as_file(resource) as path:
        return parse_scenario(path.read_text(encoding="utf-8"), str(path))
