"""``python -m surge ...``: the ``surge`` command, for an environment whose scripts folder is not on
the PATH (``python -m surge serve MODEL``, as ``surge serve MODEL``)."""

import sys

from surge.cli import main

if __name__ == "__main__":
    sys.exit(main())
