"""The archive: events that leave the hot log, kept as compressed JSON lines in an object store.

- :mod:`archive.store`: the object-store port (put/get/list by key) and its directory adapter.
- :mod:`archive.files`: the file format and the per-partition manifest.
- :mod:`archive.archive`: :class:`~archive.archive.Archive`, writing and reading ranges.
- :mod:`archive.archiver`: copies a partition's events from the log into the archive.
- :mod:`archive.reading`: :class:`~archive.reading.ArchivedLog`, the log port over archive + log,
  so every reader that starts at offset 0 still can.
"""
