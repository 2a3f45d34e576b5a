"""`python -m lynx_deploy.estimate`."""

import sys

from lynx_deploy.estimate.cli import main

sys.exit(main())
