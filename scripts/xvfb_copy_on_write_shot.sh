#!/bin/bash
# The README's first picture: a real window under Xvfb at step 6 of the tour, then → and a
# grab while copy-on-write's arrow flies (block 6 → its copy); saves /tmp/xcow.png.
source "$(dirname "$0")/xvfb_lib.sh"
start_xvfb 83
launch_app /tmp/xcow_app.log 9 default --size 1280x800 --steps 6
place_window
xdotool windowfocus "$WID"; sleep 0.3
xdotool key Escape; sleep 0.8  # the first start's welcome
xdotool mousemove 1200 440 click 1; sleep 0.3  # focus on the pool's empty corner
xdotool key Right
sleep 0.17
grab /tmp/xcow.png
stop_all
