"""The pagesim desktop app (PySide6 + pyqtgraph). Views and a controller only:
it turns user actions into operations and animates the events the core returns."""

import os
import sys


def _is_window_process(argv: list[str]) -> bool:
    """``pagesim gui …``, ``pagesim bench --gui`` or a bare ``pagesim`` (the app)."""
    args = argv[1:]
    return not args or args[0] == "gui" or (args[0] == "bench" and "--gui" in args)


# The window shares two cores with the kernel's and torch's OpenMP threads; threads that
# spin while idle (OpenMP's default) take the time the window needs to repaint. libgomp
# reads the policy once, when it is loaded (torch loads it at import), so it is set here,
# before anything imports them; headless runs and benchmarks keep OpenMP's default.
if _is_window_process(sys.argv):
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main(argv: list[str] | None = None) -> int:
    """The ``pagesim`` command: the command line, imported here so that a Ctrl-C while its
    modules load (numpy, the engine: about a quarter of a second) ends as one after it does."""
    try:
        from pagesim.app.cli import main as command_line
    except KeyboardInterrupt:
        print("\ninterrupted: nothing was written", file=sys.stderr)
        return 130  # 128 + SIGINT, as the command line itself returns
    return command_line(argv)
