"""postprocess/metrics_file.py: the one reader of metrics.jsonl in the repository.

metrics.py builds its tables on it; the tests (tests/cli/z3dcheck.py) and the benchmark scripts
(bench_stats.py) read records through it. Only the standard library: any python3 imports it,
and without pandas' second of start-up.

  records(run, kind=None)   a run's records in file order, of one "kind" if given; run is
                            RUN_DIR, or a path ending in .jsonl (its metrics.jsonl, or a copy)
  read_jsonl(path)          the objects of any JSON-lines file (`zero3d plan --json`'s too)
  numbered(path)            (line number, object) for each line that is not blank

A missing file or a line that is not a JSON object raises MetricsError: one line naming the file
(and the line).
"""
import json
from pathlib import Path


class MetricsError(Exception):
    """A user error: one line naming the file (and line) and what is wrong."""


def numbered(path):
    """(line number, object) for each line of a JSON-lines file that is not blank."""
    path = Path(path)
    if not path.is_file():
        raise MetricsError(f"{path}: no such file")
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                r = None
            if not isinstance(r, dict):
                raise MetricsError(f"{path}:{n}: not a JSON object: {line.strip()[:60]}")
            yield n, r


def read_jsonl(path) -> list:
    """The objects of a JSON-lines file, in order."""
    return [r for _, r in numbered(path)]


def records(run, kind=None) -> list:
    """A run's metrics.jsonl records in file order (of one kind if given)."""
    path = Path(run) if str(run).endswith(".jsonl") else Path(run) / "metrics.jsonl"
    return [r for r in read_jsonl(path) if kind is None or r.get("kind") == kind]
