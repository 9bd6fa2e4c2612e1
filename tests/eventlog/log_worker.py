"""Child process of the log server's tests: a worker's membership over ``RemoteLog``, driven one
line at a time on stdin, each answered by one line on stdout.

``python log_worker.py <socket path> <member id>``

    own 1,3,5       poll (once at least) until it owns exactly these partitions; keeps their
                    writers
                    -> ``owned 1,3,5``
    append          append one event with each writer kept at the last ``own``, without polling
                    -> ``appended 1:ok 3:fenced 5:fenced``
"""

from __future__ import annotations

import sys
import time

from core.errors import Fenced
from eventlog.port import PartitionWriter
from eventlog.remote import RemoteLog


class Quiet:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


def main() -> None:
    path, member_id = sys.argv[1], sys.argv[2]
    log = RemoteLog(path, member_id)
    member = log.join(Quiet())
    writers: dict[int, PartitionWriter] = {}
    for line in sys.stdin:
        command, _, argument = line.strip().partition(" ")
        if command == "own":
            wanted = {int(p) for p in argument.split(",") if p}
            deadline = time.monotonic() + 30.0
            member.poll(0.05)  # at least once: what it owned may be gone without its knowing
            while member.owned() != wanted and time.monotonic() < deadline:
                member.poll(0.05)
            writers = {p: member.writer(p) for p in member.owned()}
            answer = "owned " + ",".join(map(str, sorted(member.owned())))
        elif command == "append":
            outcomes = []
            for partition, writer in sorted(writers.items()):
                try:
                    writer.append([f"{member_id}:{partition}".encode()])
                    outcomes.append(f"{partition}:ok")
                except Fenced:
                    outcomes.append(f"{partition}:fenced")
            answer = "appended " + " ".join(outcomes)
        else:
            answer = f"unknown command {command!r}"
        sys.stdout.write(answer + "\n")
        sys.stdout.flush()
    log.close()


if __name__ == "__main__":
    main()
