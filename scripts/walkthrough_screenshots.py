"""Screenshots of the kernel walk-through for the README (docs/screenshots/walkthrough-*.png):
the tour at a merge of the CUDA kernel, the seed demo folding tile by tile on the CPU,
the long-context scenario at v2's reduce; each at 1280 × 800 and 1920 × 1080.

    QT_QPA_PLATFORM=offscreen .venv/bin/python scripts/walkthrough_screenshots.py
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "screenshots"

# (scenario, step, kernel, which stage: "merge:<stage kind>" or a token stage index)
SHOTS = [
    ("default", 8, "cuda-v1", "merge:warp"),
    ("seed_demo", 2, "cpu", "5"),
    ("long_context", 2, "cuda-v2", "merge:reduce"),
]
SIZES = [(1280, 800), (1920, 1080)]


def main() -> None:
    app = QApplication([])
    from pagesim.app.gui.main_window import MainWindow
    from pagesim.core.scenario import load_shipped
    from pagesim.core.walkthrough import KERNEL_CHOICES

    def pump(cond, seconds=60.0):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()
            if cond():
                return
            time.sleep(0.005)
        raise TimeoutError("the window did not get there in time")

    for name, step, kernel, stage in SHOTS:
        for width, height in SIZES:
            settings = QSettings(os.path.join(tempfile.mkdtemp(), "pagesim.ini"), QSettings.Format.IniFormat)
            window = MainWindow("cpu", settings=settings, speed=0.0)
            window.resize(width, height)
            window.show()
            window.load(load_shipped(name))
            pump(lambda w=window: w.frame is not None and w.controller.pending == 0)
            window.controller.seek(step)
            pump(lambda w=window, n=step: w.frame.position == n and w.controller.pending == 0)
            window.show_walkthrough()
            panel = window.walkthrough
            panel.kernel_box.setCurrentIndex(list(KERNEL_CHOICES).index(kernel))
            pump(
                lambda p=panel, w=window, k=kernel: (
                    p.walk is not None and p.walk.kernel == k and w.controller.pending == 0
                )
            )
            walk = panel.walk
            if stage.startswith("merge:"):
                kind = stage.split(":")[1]
                first = next(i for i, m in enumerate(walk.trace.merges) if m.stage == kind)
                target = len(walk.trace.steps) + first + (1 if kind == "warp" else 0)
            else:
                target = int(stage)
            panel.show_stage(target)
            for _ in range(30):
                app.processEvents()
            path = OUT / f"walkthrough-{name.replace('_', '-')}-{width}.png"
            window.grab().save(str(path))
            print("saved", path.relative_to(ROOT))
            window.controller.shutdown()
            window.close()


if __name__ == "__main__":
    main()
