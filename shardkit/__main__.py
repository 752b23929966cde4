"""``python -m shardkit``: the same as the ``shardkit`` command."""

import sys

from shardkit.cli import main

if __name__ == "__main__":
    sys.exit(main())
