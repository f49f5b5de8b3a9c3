"""Small scenarios on the synthetic model for the study panels' tests (the studies replay
memory only), and a window opened on one of them."""

from pagesim.app.gui.main_window import MainWindow
from pagesim.core.scenario import parse_scenario

from tests.app.conftest import wait_idle

TOY = "num_blocks = 24\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\nseed = 4\nwatermark = 0.0\n"
# Sequences added by hand, no requests: the pool's picture, no latency.
BY_HAND = 'name = "by hand"\n' + TOY + "".join(
    f'[[steps]]\nop = "{op}"\nseq = "{seq}"\n{extra}\n'
    for op, seq, extra in (
        ("add", "A", "tokens = 6"), ("add", "B", "tokens = 9"), ("grow", "A", "tokens = 5"),
        ("fork", "A", 'as = "C"'), ("grow", "C", "tokens = 3"), ("free", "B", ""), ("grow", "A", "tokens = 6"),
    )
)  # fmt: skip
# Three requests that outgrow the pool: the newest is preempted (recomputed) while they decode.
REQUESTS = (
    'name = "requests"\npreemption = "recompute"\n' + TOY
    + '[[steps]]\nop = "submit"\nrequest = "r1"\ntokens = 18\noutput = 20\n'
    + '[[steps]]\nop = "submit"\nrequest = "r2"\ntokens = 14\noutput = 20\n'
    + '[[steps]]\nop = "submit"\nrequest = "r3"\ntokens = 10\noutput = 16\nn = 2\n'
    + '[[steps]]\nop = "schedule"\nsteps = 6\n'
)  # fmt: skip
V1_REQUESTS = REQUESTS.replace('preemption = "recompute"', 'preemption = "recompute"\nscheduler = "v1"').replace(
    "watermark = 0.0\n",
    "",  # (v0's admission rule: v1 has none)
)

SYSTEM_PROMPT = list(range(1, 17))  # four full blocks of 4
# Three sequences sharing a system prompt, with prefix caching on.
SHARED_PREFIX = (
    'name = "shared prefix"\nnum_blocks = 24\nblock_size = 4\nnum_heads = 2\nhead_dim = 8\n'
    "prefix_caching = true\n"
    + "".join(
        f'[[steps]]\nop = "add"\nseq = "{seq}"\nprompt = {SYSTEM_PROMPT + own}\n'
        for seq, own in (("a", [100, 101]), ("b", [200]), ("c", [300, 301, 302]))
    )
)


class ToyWindows:
    """Windows opened on the scenarios above (none of the shipped ones: they may move to a
    real model, which the studies cannot replay); ``close`` closes them all."""

    def __init__(self, qtbot, settings) -> None:
        self.qtbot, self.settings, self.windows = qtbot, settings, []

    def __call__(self, text: str):
        window = MainWindow("cpu", settings=self.settings, speed=0.0)
        self.qtbot.addWidget(window)
        window.show()
        window.load(parse_scenario(text))
        self.windows.append(window)
        wait_idle(self.qtbot, window)
        return window

    def close(self) -> None:
        for window in self.windows:
            window.close()
