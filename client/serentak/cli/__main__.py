"""`python -m serentak.cli`."""

import sys

from serentak.cli import main

sys.exit(main())
