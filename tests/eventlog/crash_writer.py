"""Child process of the kill -9 test: writes to an embedded log from many threads until killed.

``python crash_writer.py <log dir> <partitions> <threads> <round>``

Threads ``0 .. partitions-1`` each own one partition's writer and append batches of 1-4 events;
the other threads submit commands. A line goes to stdout only after its write returned, so
every line is an acknowledgement the log must keep::

    C <round> <thread> <seq> <partition> <offset>                  a command
    E <round> <thread> <seq> <partition> <first offset> <count>    a batch of events

Values name their writer, so the parent can check what survived: ``c/<round>/<thread>/<seq>``
for a command, ``e/<round>/<thread>/<seq>/<i>/<count>/<through>`` for the ``i``-th event of a
batch appended with ``commands_through=through``.
"""

from __future__ import annotations

import sys
import threading

from eventlog.embedded import EmbeddedLog
from eventlog.port import PartitionWriter

_print_lock = threading.Lock()


def acknowledge(line: str) -> None:
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Quiet:
    def assigned(self, partitions: list[int]) -> None:
        pass

    def revoked(self, partitions: list[int]) -> None:
        pass


def submit_forever(log: EmbeddedLog, round_: int, thread: int, partition: int) -> None:
    seq = 0
    while True:
        offset = log.submit(partition, f"c/{round_}/{thread}/{seq}".encode())
        acknowledge(f"C {round_} {thread} {seq} {partition} {offset}")
        seq += 1


def append_forever(writer: PartitionWriter, round_: int, thread: int) -> None:
    seq = 0
    while True:
        count, through = seq % 4 + 1, round_ * 1_000_000 + seq + 1
        events = [f"e/{round_}/{thread}/{seq}/{i}/{count}/{through}".encode() for i in range(count)]
        offsets = writer.append(events, commands_through=through)
        acknowledge(f"E {round_} {thread} {seq} {writer.partition} {offsets[0]} {count}")
        seq += 1


def main() -> None:
    path, partitions, threads, round_ = sys.argv[1], *map(int, sys.argv[2:5])
    log = EmbeddedLog.open(path, partitions)
    member = log.join(Quiet())
    member.poll(0.0)
    workers = [
        threading.Thread(target=append_forever, args=(member.writer(t), round_, t))
        if t < partitions
        else threading.Thread(target=submit_forever, args=(log, round_, t, t % partitions))
        for t in range(threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()


if __name__ == "__main__":
    main()
