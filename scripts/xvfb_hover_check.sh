#!/bin/bash
# Drive a real window under Xvfb: launch at step 8 of the tour, hover a token of the token
# map with xdotool, save the screen to /tmp/xdo_hover.png. Needs xvfb, xdotool, x11-apps, imagemagick.
export DISPLAY=:77
Xvfb :77 -screen 0 1280x800x24 >/dev/null 2>&1 &
XPID=$!
sleep 1
export HOME=$(mktemp -d)
QT_QPA_PLATFORM=xcb .venv/bin/pagesim gui assets/scenarios/default.toml --size 1280x800 --steps 8 > /tmp/xdo_app.log 2>&1 &
APP=$!
sleep 8
WID=$(xdotool search --name "pagesim" | head -1)
echo "window $WID"
xdotool windowmove $WID 0 0; sleep 0.5
# step forward 8 times with the Right key


sleep 1
# hover the 6th token in the token map (strip under the table at y≈395)
xdotool mousemove 60 400; sleep 0.3; xdotool mousemove 62 398; sleep 1
xwd -root -silent | convert xwd:- /tmp/xdo_hover.png
kill $APP; sleep 0.5; kill $XPID
