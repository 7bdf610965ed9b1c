#!/usr/bin/env python
"""Thin wrapper: ``python scripts/bench.py ARGS`` is ``python -m gdnconv bench ARGS``.

See ``python -m gdnconv bench --help`` (or ``gdnconv.bench``'s docstring) for what it
measures and the flags.
"""
import sys

from gdnconv.bench import main

if __name__ == "__main__":
    sys.exit(main())
