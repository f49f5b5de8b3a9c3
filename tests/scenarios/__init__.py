"""Scenario files for tests. ``synthetic_<name>.toml`` are the teaching scenarios as they
were on the synthetic token model (the shipped ones now run SmolLM2): tests of the kernel's
trace, of the window's layout and of what the engine does with sequences use them, so they
stay as fast and as exact as they were."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pagesim.core.scenario import shipped_folder, shipped_scenarios

HERE = Path(__file__).resolve().parent


def synthetic(name: str) -> str:
    """The synthetic copy of the shipped scenario ``name``, as a path to load."""
    return str(HERE / f"synthetic_{name}.toml")


def on_the_token_model() -> dict[str, str]:
    """Every scenario on the synthetic token model: the shipped ones that name no model,
    and the synthetic copies of the others. Name -> what load_scenario takes."""
    folder = shipped_folder()
    out = {}
    for name in shipped_scenarios():
        header = tomllib.loads((folder / f"{name}.toml").read_text())
        if header.get("model", "synthetic") == "synthetic":
            out[name] = name
    out.update({p.stem: str(p) for p in sorted(HERE.glob("synthetic_*.toml"))})
    return out


def token_model(name: str) -> str:
    """``name`` on the synthetic token model: its copy, or the shipped one where it never moved."""
    copy = HERE / f"synthetic_{name}.toml"
    return str(copy) if copy.is_file() else name
