#!/usr/bin/env bash
# Installs the omnitts GStreamer plugin and its bundled voice.
#
#   bash scripts/install.sh --user           # for this user, no root needed
#   bash scripts/install.sh                  # system-wide, where GStreamer looks (root)
#   bash scripts/install.sh --prefix /opt/omnitts
#   bash scripts/install.sh --uninstall [--user | --prefix DIR]
#
# Where things go:
#   --user    plugin ${XDG_DATA_HOME:-~/.local/share}/gstreamer-1.0/plugins/libgstomnitts.so (GStreamer scans it)
#             voice  ${XDG_DATA_HOME:-~/.local/share}/omnitts/voices/omnitts-en
#   (default) plugin GStreamer's own plugin directory (pkg-config gstreamer-1.0 pluginsdir, e.g.
#             /usr/lib/x86_64-linux-gnu/gstreamer-1.0); voice <its prefix>/share/omnitts/voices/omnitts-en
#   --prefix  plugin <prefix>/lib/gstreamer-1.0/libgstomnitts.so (then GST_PLUGIN_PATH=<that dir>)
#             voice  <prefix>/share/omnitts/voices/omnitts-en
# omnittssrc finds the voice there with no model set: OMNITTS_VOICE_DIR, then the XDG data directories
# ($XDG_DATA_HOME, $XDG_DATA_DIRS, default /usr/local/share:/usr/share), then <prefix>/share next to the
# plugin's own lib directory, then the source tree it was built from (README.md, "Install").
#
# Options:
#   --prefix DIR      installation prefix
#   --user            install for the current user
#   --plugindir DIR   where the plugin goes (e.g. /usr/lib/x86_64-linux-gnu/gstreamer-1.0)
#   --datadir DIR     the data directory the voice goes under
#   --destdir DIR     stage everything under DIR (packaging: DESTDIR); paths are as if DIR were /
#   --debug           install the debug build (target/debug) instead of the release build
#   --no-build        do not run cargo; install the plugin already built ($CARGO_TARGET_DIR honoured)
#   --uninstall       remove what an install with the same options put in place
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

prefix=
user=0
plugindir=
datadir=
destdir=
profile=release
build=1
uninstall=0
while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) prefix="${2:?--prefix needs a directory}"; shift ;;
        --prefix=*) prefix="${1#*=}" ;;
        --user) user=1 ;;
        --plugindir) plugindir="${2:?--plugindir needs a directory}"; shift ;;
        --plugindir=*) plugindir="${1#*=}" ;;
        --datadir) datadir="${2:?--datadir needs a directory}"; shift ;;
        --datadir=*) datadir="${1#*=}" ;;
        --destdir) destdir="${2:?--destdir needs a directory}"; shift ;;
        --destdir=*) destdir="${1#*=}" ;;
        --debug) profile=debug ;;
        --release) profile=release ;;
        --no-build) build=0 ;;
        --uninstall) uninstall=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ "$user" = 1 ]; then
    user_data="${XDG_DATA_HOME:-${HOME:?HOME is not set}/.local/share}"
    : "${plugindir:=$user_data/gstreamer-1.0/plugins}"
    : "${datadir:=$user_data}"
elif [ -n "$prefix" ]; then
    : "${plugindir:=$prefix/lib/gstreamer-1.0}"
    : "${datadir:=$prefix/share}"
else
    gst_plugins="$(pkg-config --variable=pluginsdir gstreamer-1.0 2>/dev/null)" \
        || { echo "install.sh: pkg-config knows no gstreamer-1.0; give --prefix or --user" >&2; exit 1; }
    : "${plugindir:=$gst_plugins}"
    : "${datadir:=$(pkg-config --variable=prefix gstreamer-1.0)/share}"
fi
for d in "$plugindir" "$datadir"; do
    case "$d" in /*) ;; *) echo "install.sh: '$d' is not an absolute path" >&2; exit 2 ;; esac
done
plugin_dest="$destdir$plugindir/libgstomnitts.so"
voice_dest="$destdir$datadir/omnitts/voices/omnitts-en"

if [ "$uninstall" = 1 ]; then
    rm -f "$plugin_dest"
    rm -rf "$voice_dest"
    rmdir -p "$(dirname "$voice_dest")" 2>/dev/null || true
    echo "removed $plugin_dest and $voice_dest"
    exit 0
fi

target="${CARGO_TARGET_DIR:-$PWD/target}"
if [ "$build" = 1 ]; then
    if [ "$profile" = release ]; then cargo build --release --lib; else cargo build --lib; fi
fi
plugin="$target/$profile/libgstomnitts.so"
[ -f "$plugin" ] || { echo "install.sh: no plugin at $plugin (build it, or drop --no-build)" >&2; exit 1; }

voice=models/omnitts-en
install -d "$(dirname "$plugin_dest")"
install -m 0755 "$plugin" "$plugin_dest"
# The voice: a fresh copy (files of an older version removed), readable by all.
rm -rf "$voice_dest"
(cd "$voice" && find . -type d) | while read -r d; do install -d "$voice_dest/$d"; done
(cd "$voice" && find . -type f) | while read -r f; do install -m 0644 "$voice/$f" "$voice_dest/$f"; done
echo "plugin: $plugin_dest"
echo "voice:  $voice_dest"
scanned="$(pkg-config --variable=pluginsdir gstreamer-1.0 2>/dev/null || true)"
if [ "$plugindir" != "$scanned" ] && [ "$plugindir" != "${XDG_DATA_HOME:-$HOME/.local/share}/gstreamer-1.0/plugins" ]; then
    echo "GStreamer does not scan $plugindir by itself: export GST_PLUGIN_PATH=$plugindir"
fi
