"""``python -m applier``: the same as the ``applier`` console script."""

import sys

from applier.cli import main

sys.exit(main())
