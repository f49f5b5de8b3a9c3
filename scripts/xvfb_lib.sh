#!/bin/bash
# Shared by the scripts/xvfb_*_check.sh drivers: a virtual display, the app in it with a
# fresh HOME (first-run settings), its window found and put at the origin, screen grabs.
# Needs xvfb, xdotool, x11-apps, imagemagick.

# start_xvfb DISPLAY_NUMBER [WxH]: a 1280 × 800 screen (or WxH); sets DISPLAY and XPID.
start_xvfb() {
  export DISPLAY=":$1"
  Xvfb "$DISPLAY" -screen 0 "${2:-1280x800}x24" >/dev/null 2>&1 &
  XPID=$!
  sleep 1
  export HOME=$(mktemp -d) XDG_CONFIG_HOME=$(mktemp -d)
}

# launch_app LOG WAIT_SECONDS ARGS...: `pagesim gui ARGS` in the display; sets APP.
launch_app() {
  local log=$1 wait=$2
  shift 2
  QT_QPA_PLATFORM=xcb .venv/bin/pagesim gui "$@" > "$log" 2>&1 &
  APP=$!
  sleep "$wait"
}

# place_window: the app's window at the screen's origin, so screen coordinates are the window's.
place_window() {
  WID=$(xdotool search --name "pagesim" | head -1)
  echo "window $WID"
  xdotool windowmove "$WID" 0 0
  sleep 0.5
}

grab() { xwd -root -silent | convert xwd:- "$1"; }

stop_all() {
  kill "$APP"
  sleep 0.5
  kill "$XPID"
}
