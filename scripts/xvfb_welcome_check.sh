#!/bin/bash
# The first interactive start under Xvfb (fresh settings): the welcome dialog over the window;
# saves the screen to /tmp/xwelcome.png. Needs xvfb, x11-apps, imagemagick.
export DISPLAY=:78
Xvfb :78 -screen 0 1280x800x24 >/dev/null 2>&1 &
XPID=$!
sleep 1
export HOME=$(mktemp -d) XDG_CONFIG_HOME=$(mktemp -d)
QT_QPA_PLATFORM=xcb .venv/bin/pagesim gui --size 1280x800 > /tmp/xwelcome_app.log 2>&1 &
APP=$!
sleep 7
xwd -root -silent | convert xwd:- /tmp/xwelcome.png
kill $APP; sleep 0.5; kill $XPID
