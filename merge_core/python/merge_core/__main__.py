"""`python -m merge_core MANIFEST OUTPUT`: see `merge_core.cli`."""

import sys

from merge_core.cli import main

if __name__ == "__main__":
    sys.exit(main())
