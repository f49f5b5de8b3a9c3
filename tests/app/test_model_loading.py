"""A real model not yet in memory loads off the GUI thread, with a progress bar, and the
scenario opens when it is ready; the window stays usable meanwhile (a synthetic scenario
opened during the load stands), and a model that cannot be loaded says why."""

import threading

import pytest
from pagesim.app.gui import model_loader
from pagesim.core.models.gguf_loader import CACHE_ENV
from pagesim.core.scenario import load_shipped

from tests.app.conftest import wait_idle
from tests.models import tiny_gguf

SCENARIO = (
    'name = "tiny"\nmodel = "tiny.gguf"\nnum_blocks = 8\nblock_size = 4\n'
    '[[steps]]\nop = "add"\nseq = "a"\nprompt = "hi there"\n'
)


@pytest.fixture
def tiny_scenario(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))  # a first load: dequantised, never the user's cache
    tiny_gguf.write_llama(tmp_path / "tiny.gguf")
    path = tmp_path / "tiny.toml"
    path.write_text(SCENARIO)
    return str(path)


def test_a_model_loads_with_progress_then_its_scenario_opens(make_window, qtbot, tiny_scenario):
    window = make_window("seed_demo")
    stages = []
    window.model_loader.progressed.connect(lambda _, stage, fraction: stages.append((stage, fraction)))
    assert window.files.open_scenario(tiny_scenario)
    assert window.model_loader.loading and window.model_loader.progress.isVisibleTo(window)
    qtbot.waitUntil(lambda: window.frame.scenario_name == "tiny", timeout=60_000)
    wait_idle(qtbot, window)
    assert not window.model_loader.loading and not window.model_loader.progress.isVisibleTo(window)
    names = [stage for stage, _ in stages]
    assert "hashing the file" in names and any(n.startswith("dequantising") for n in names)
    fractions = [fraction for _, fraction in stages]
    assert fractions == sorted(fractions) and fractions[0] >= 0 and fractions[-1] < 1
    # In memory now: opening it again goes through at once.
    assert window.files.open_scenario(tiny_scenario) and not window.model_loader.loading


def test_a_synthetic_scenario_opened_during_the_load_stands(make_window, qtbot, tiny_scenario, monkeypatch):
    release = threading.Event()
    load = model_loader.load_model

    def held(name):
        release.wait(30)
        return load(name)

    monkeypatch.setattr(model_loader, "load_model", held)
    window = make_window("seed_demo")
    assert window.files.open_scenario(tiny_scenario) and window.model_loader.loading
    assert window.files.open_scenario("stress")  # usable meanwhile
    stress = load_shipped("stress").name
    qtbot.waitUntil(lambda: window.frame.scenario_name == stress and window.controller.pending == 0, timeout=30_000)
    release.set()
    qtbot.waitUntil(lambda: not window.model_loader.loading, timeout=60_000)
    qtbot.wait(50)
    assert window.frame.scenario_name == stress and window.controller.pending == 0


def test_a_model_of_another_architecture_is_refused_by_name(make_window, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    tiny_gguf.write_other_architecture(tmp_path / "tiny.gguf", "qwen2")
    path = tmp_path / "tiny.toml"
    path.write_text(SCENARIO)
    window = make_window("seed_demo")
    window.files.open_scenario(str(path))
    qtbot.waitUntil(lambda: not window.model_loader.loading, timeout=60_000)
    assert "could not load the model" in window.last_error and "qwen2" in window.last_error
    assert window.frame.scenario_name != "tiny"


def test_the_worker_runs_a_real_model_on_the_chosen_thread_count(make_window, qtbot):
    from pagesim.core.models.threads import chosen_threads

    window = make_window("default", real=True)
    count = chosen_threads()[0]
    assert f", {count} thread{'s' if count != 1 else ''} ·" in window.frame.device  # Numba's count is per thread


def test_a_shipped_scenario_that_cannot_be_parsed_says_why_and_the_current_stays(make_window, qtbot, monkeypatch):
    from pagesim.app.gui import main_window
    from pagesim.core.errors import PagesimError

    window = make_window("seed_demo")
    before = window.frame.scenario_name

    def refused(name):
        raise PagesimError(f"{name}: cannot be parsed here")

    monkeypatch.setattr(main_window, "load_shipped", refused)
    window.open_shipped("stress")
    assert window.last_error == "stress: cannot be parsed here"
    wait_idle(qtbot, window)
    assert window.frame.scenario_name == before
