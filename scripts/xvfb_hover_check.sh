#!/bin/bash
# Drive a real window under Xvfb: launch at step 8 of the tour, hover a token of the token
# map with xdotool, save the screen to /tmp/xdo_hover.png.
source "$(dirname "$0")/xvfb_lib.sh"
start_xvfb 77
launch_app /tmp/xdo_app.log 8 assets/scenarios/default.toml --size 1280x800 --steps 8
place_window
sleep 7  # the eight steps animate at 1× first
# hover the 6th token in the token map (its second row, at y≈431)
xdotool mousemove 70 428; sleep 0.3; xdotool mousemove 72 431; sleep 1
grab /tmp/xdo_hover.png
stop_all
