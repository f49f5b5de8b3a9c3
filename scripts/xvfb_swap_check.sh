#!/bin/bash
# Drive a real window under Xvfb: open the preemption-by-swap example at step 14, click
# Forward with xdotool at 1× speed and grab the screen mid-swap (tiles flying from the GPU
# pool to the CPU pool) to /tmp/xdo_swap.png, and after it to /tmp/xdo_swap_after.png.
source "$(dirname "$0")/xvfb_lib.sh"
start_xvfb 78
launch_app /tmp/xdo_swap_app.log 24 assets/scenarios/preemption_swap.toml --size 1280x800 --steps 14
place_window
# Forward on the transport bar (1× speed: a fresh HOME keeps the default; the 14 steps
# before it play at that speed, hence the long wait above)
xdotool mousemove 310 758 click 1
sleep 0.4
grab /tmp/xdo_swap.png
sleep 1.5
grab /tmp/xdo_swap_after.png
stop_all
