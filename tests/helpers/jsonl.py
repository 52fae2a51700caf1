"""JSON-lines files that worker processes and the test process share.

A line is flushed to the OS as soon as it is written, so it survives a SIGKILL or a SIGSTOP
of its writer, and lines appended by several processes do not mix (each is one short write
to a file opened for appending).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append `record` to `path` as one line."""
    with path.open("a", encoding="utf-8") as file:
        file.write(json.dumps(record) + "\n")
        file.flush()


def read_jsonl(*paths: Path) -> list[dict[str, Any]]:
    """Every record of the files `paths` that exist, in file order."""
    records: list[dict[str, Any]] = []
    for path in paths:
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    records.append(json.loads(line))
    return records
