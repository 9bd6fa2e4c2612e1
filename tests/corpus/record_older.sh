#!/bin/sh
# Records the corpus of an earlier build: that build's own code (core, embedded log, state
# store, snapshots, archive, read model, checkpoint) writes it, driven by today's recorder
# (tools/replay/corpus*.py, canonical.py) copied into its checkout; the recorder passes over
# what the build lacks (leases granted ahead before events schema 5, the lead time before 4).
#
#     tests/corpus/record_older.sh COMMIT tests/corpus/<date>-v<schema>-<commit>
#
# The corpora it recorded: 2026-12-01-v3-9bb7e51 (events schema 3, state snapshot format 1:
# the build before snapshot format 2, as tests/projections/data/make_format1.py) and
# 2026-12-03-v4-e4eed0c (events schema 4, the last build before RunStarted and
# LeaseGranted.start_at).
set -eu
commit=$(git rev-parse "$1")
out=$(realpath -m "$2")
repo=$(git rev-parse --show-toplevel)
python=${PYTHON:-$repo/.venv/bin/python}
checkout=$(mktemp -d)
trap 'rm -rf "$checkout"' EXIT
git -C "$repo" archive "$commit" | tar -x -C "$checkout"
cp "$repo"/tools/replay/canonical.py "$repo"/tools/replay/corpus.py \
    "$repo"/tools/replay/corpus_scenario.py "$checkout"/tools/replay/
cd "$checkout"
PYTHONPATH="$checkout" "$python" -c "
import sys
from pathlib import Path
from tools.replay import corpus
m = corpus.record(Path(sys.argv[1]), build={'commit': sys.argv[2], 'recorder': 'tests/corpus/record_older.sh'})
print(sys.argv[1], m['formats'], sum(m['kinds'].values()), 'events')
" "$out" "$commit"
