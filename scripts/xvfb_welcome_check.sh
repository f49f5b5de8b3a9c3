#!/bin/bash
# The first interactive start under Xvfb (fresh settings): the welcome dialog over the window;
# saves the screen to /tmp/xwelcome.png.
source "$(dirname "$0")/xvfb_lib.sh"
start_xvfb 79
launch_app /tmp/xwelcome_app.log 7 --size 1280x800
grab /tmp/xwelcome.png
stop_all
