"""What the gatherer wrote is read back once per record: a read tried again repeats some
lines, and a read cut short leaves half a line."""

from __future__ import annotations

from pathlib import Path

from tools.chaos import gather


def test_a_file_of_records_is_read_back_each_once_and_a_cut_line_ends_it(tmp_path: Path) -> None:
    path = tmp_path / "topic.jsonl"
    path.write_text(
        '{"p": 0, "o": 1, "e": {"run_id": "a"}, "t": 5}\n'
        '{"p": 0, "o": 1, "e": {"run_id": "a"}, "t": 5}\n'  # read again after a retry
        '{"p": 1, "o": 0, "e": null}\n'  # not JSON: no record; no timestamp (an old file)
        '{"p": 0, "o": 3, "e": {"run_id": "b"}, "t": 9}\n'
        '{"p": 0, "o": 4'  # the read was cut here
    )
    assert gather.read_file(path) == {
        0: [(1, {"run_id": "a"}, 5), (3, {"run_id": "b"}, 9)],
        1: [(0, None, None)],
    }
    assert gather.topic_records(path) == [
        {"e": {"run_id": "a"}, "t": 5},
        {"e": {"run_id": "b"}, "t": 9},
        {"e": None, "t": None},
    ]
    assert gather.read_file(tmp_path / "never-written.jsonl") == {}
