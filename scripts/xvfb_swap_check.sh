#!/bin/bash
# Drive a real window under Xvfb: open the preemption-by-swap example at step 14, press →
# with xdotool at 1× speed and grab the screen mid-swap (tiles flying from the GPU pool to
# the CPU pool) to /tmp/xdo_swap.png. Needs xvfb, xdotool, x11-apps, imagemagick.
export DISPLAY=:78
Xvfb :78 -screen 0 1280x800x24 >/dev/null 2>&1 &
XPID=$!
sleep 1
export HOME=$(mktemp -d)
QT_QPA_PLATFORM=xcb .venv/bin/pagesim gui assets/scenarios/preemption_swap.toml --size 1280x800 --steps 14 > /tmp/xdo_swap_app.log 2>&1 &
APP=$!
sleep 8
WID=$(xdotool search --name "pagesim" | head -1)
echo "window $WID"
xdotool windowmove "$WID" 0 0; sleep 0.5
# click Forward on the transport bar (1× speed: a fresh HOME keeps the default)
xdotool mousemove 310 758 click 1
sleep 0.4
xwd -root -silent | convert xwd:- /tmp/xdo_swap.png
sleep 1.5
xwd -root -silent | convert xwd:- /tmp/xdo_swap_after.png
kill $APP; sleep 0.5; kill $XPID
