import sys

from tools.chaos.cli import main

sys.exit(main())
