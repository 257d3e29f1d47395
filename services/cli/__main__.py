"""`python -m services.cli`."""

import sys

from services.cli import main

sys.exit(main())
