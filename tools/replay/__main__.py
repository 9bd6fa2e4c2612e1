import signal
import sys

from tools.replay.cli import main

if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `... dump | head` ends quietly
    sys.exit(main())
