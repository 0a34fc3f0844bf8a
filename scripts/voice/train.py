#!/usr/bin/env python3
"""Training recipe for the bundled omnitts English voice: `python scripts/voice/train.py STEP ...` (`--help` lists the
steps and options). The recipe is the package omnitts_py.voice (scripts/omnitts_py/voice/, one module per step); this
file only finds it: next to this file (a device-machine copy that carries omnitts_py/ beside train.py) or in the
repository's scripts/ folder."""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

from omnitts_py.voice.cli import main  # noqa: E402

if __name__ == "__main__":
    main()
