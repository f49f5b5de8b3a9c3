#!/bin/bash
# The kernel walk-through in a real 1024 × 700 window under Xvfb: the window fits the screen,
# the Walk-through tab opens, and its plots scroll (the scroll bar's down arrow clicked eight
# times brings "Who reads each token" into view). Saves /tmp/xwalk_open.png and /tmp/xwalk_scrolled.png.
source "$(dirname "$0")/xvfb_lib.sh"
start_xvfb 83 1024x700
launch_app /tmp/xwalk_app.log 9 default --size 1024x700 --steps 8
place_window
xdotool key Escape  # the first start's welcome dialog
sleep 0.5
xdotool mousemove 717 83 click 1  # the Walk-through tab
sleep 3
grab /tmp/xwalk_open.png
xdotool mousemove 1008 362 click --repeat 8 --delay 100 1  # the plots' scroll bar, down arrow
sleep 1
grab /tmp/xwalk_scrolled.png
stop_all
