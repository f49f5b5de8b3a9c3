"""A sweep's PNG: blocks in use over time per variant against the original, and each
variant's steps, preemptions, prefix hit rate and (with a model shape and a GPU) latency.
Drawn with matplotlib's Agg backend: no display, no Qt."""

from __future__ import annotations

import io
import math

from pagesim.core.studies.sweep import SweepResult, VariantResult

# Okabe–Ito, as in the app; the original is drawn in black.
COLOURS = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999")


def _colour(index: int) -> str:
    return "#000000" if index == 0 else COLOURS[(index - 1) % len(COLOURS)]


def _short(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _one_numeric_knob(result: SweepResult) -> tuple[str, list] | None:
    """The knob and its values when the grid has one numeric knob: drawn as a line against it."""
    if len(result.settings) != 1:
        return None
    name, values = result.settings[0]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return None
    return name, list(values)


def _figure_panels(result: SweepResult, ran: list[tuple[int, VariantResult]]):
    from matplotlib.figure import Figure  # (a Figure saves through Agg; pyplot is never loaded)

    timed = result.hardware is not None
    fig = Figure(figsize=(13, 8.5), dpi=100, layout="constrained")
    axes = fig.subplots(2, 2)
    where = f" · {result.hardware.shape.name} on {result.hardware.gpu.name}" if timed else ""
    fig.suptitle(f"pagesim sweep · {result.source}{where}", fontsize=13)
    used = axes[0][0]
    for index, v in ran:
        xs = v.ends if timed and v.ends else range(1, len(v.used_blocks) + 1)
        slots = [n * v.config.block_size for n in v.used_blocks]  # comparable across block sizes
        used.plot(xs, slots, color=_colour(index), lw=3 if index == 0 else 1.3, label=v.label, zorder=3 - (index == 0))
    used.set_title("KV memory held: blocks in use × block size")
    used.set_xlabel("simulated seconds" if timed else "step")
    used.set_ylabel("token slots")
    used.legend(fontsize=7, loc="best")
    return fig, axes


def _per_variant(ax, result: SweepResult, ran, values, title: str, ylabel: str, fmt: str = "{:g}") -> None:
    knob = _one_numeric_knob(result)
    points = []
    if knob is not None:
        points = sorted((v.changes[knob[0]], y, i) for (i, v), y in zip(ran, values, strict=True) if v.changes)
    if points:  # (none when only the original ran: a bar of it)
        name = knob[0]
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", color="#0072B2")
        base = [y for (i, _), y in zip(ran, values, strict=True) if i == 0]
        if base and not math.isnan(base[0]):
            ax.axhline(base[0], color="#000000", ls="--", lw=1, label="original")
            ax.legend(fontsize=8)
        if name == "block_size":
            ax.set_xscale("log", base=2)
            ax.set_xticks([p[0] for p in points], [str(p[0]) for p in points])
        ax.set_xlabel(name)
    else:
        labels = ["original" if not v.changes else "\n".join(_short(x) for x in v.changes.values()) for _, v in ran]
        bars = ax.bar(range(len(ran)), values, color=[_colour(i) for i, _ in ran])
        ax.set_xticks(range(len(ran)), labels, fontsize=8)
        ax.set_xlabel(" / ".join(name for name, _ in result.settings))
        for bar, value in zip(bars, values, strict=True):
            if not math.isnan(value):
                ax.annotate(fmt.format(value), (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center",
                            va="bottom", fontsize=7)  # fmt: skip
    ax.set_title(title)
    ax.set_ylabel(ylabel)


def render_png(result: SweepResult) -> bytes:
    ran = [(i, v) for i, v in enumerate(result.variants) if v.ran]
    fig, axes = _figure_panels(result, ran)
    _per_variant(axes[0][1], result, ran, [v.steps for _, v in ran], "steps to finish", "steps")
    _per_variant(axes[1][0], result, ran, [v.preemptions for _, v in ran], "preemptions", "preemptions")
    if result.hardware is not None:
        values = [v.latency.normalized["mean"] if v.latency else math.nan for _, v in ran]
        title = "normalized latency (mean of latency / output tokens)"
        _per_variant(axes[1][1], result, ran, values, title, "s / token", "{:.4f}")
    else:
        values = [v.prefix_hit_rate * 100 for _, v in ran]
        _per_variant(axes[1][1], result, ran, values, "prefix-cache hit rate", "% of prompt blocks", "{:.0f}%")
    refused = [v.label for v in result.variants if not v.ran]
    if refused:
        fig.text(0.01, 0.002, "cannot run: " + "; ".join(refused), fontsize=8, color="#D55E00")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()
