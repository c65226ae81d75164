"""`python -m codeclog.cli`: the `codeclog` command."""

import sys

from codeclog.cli import main

sys.exit(main())
