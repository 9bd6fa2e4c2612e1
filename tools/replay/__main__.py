import logging
import os
import signal
import sys

from tools.replay.cli import main

if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `... dump | head` ends quietly
    os.umask(0o077)  # what a rebuild writes is as private as what the node writes
    # Warnings (a record that is not an event, a store set aside) go to stderr, one line each.
    logging.basicConfig(level=logging.WARNING, format="replay: %(message)s")
    sys.exit(main())
