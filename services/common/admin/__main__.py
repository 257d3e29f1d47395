"""`python -m services.common.admin --address HOST:PORT stats|dead-letters|replay|purge`."""

import sys

from services.common.admin.cli import main

sys.exit(main())
