#!/bin/bash
# Eleventh round, call 2 (carried as c2.sh beside run.sh = device_run.sh): the talker continued on the codes of all
# 44.4 h (A-D, carried) plus the second renders that call 1 (CALL=6) encoded and left on this machine as
# /tmp/vw/codesC.pt.xz (ESRC), if the machine is still the same one (it stays warm ~30 s after a call, so start this
# call at once); without them (NEED_E=1) it stops at once so that little device time is lost.
VP=$(cd "$(dirname "$0")" && pwd)
ESRC=${ESRC:-/tmp/vw/codesC.pt.xz}; E=""
if [ -s "$ESRC" ]; then cp "$ESRC" "$VP/codesE.pt.xz" && E=codesE.pt.xz; ls -la "$VP/codesE.pt.xz"
else echo "no $ESRC on this machine"; [ "${NEED_E:-1}" = 1 ] && exit 3; fi
export CODES="${CODES_BASE:-codesA.pt.xz codesB.pt.xz codesC.pt.xz codesD.pt.xz} $E"
export W=${W:-/tmp/vw2}
exec bash "$VP/run.sh"
