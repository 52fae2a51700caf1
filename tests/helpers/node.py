"""Node.js projects of the tests: real client packages from the npm registry, run as scripts.

Client-protocol tests drive the server with the packages a web team uses (the AI SDK,
AG-UI's client, the LangGraph SDK), never an imitation of them. Each such test folder
holds a small npm project (`package.json`, and the `package-lock.json` npm writes for it);
`npm_project` installs it once per checkout and `run_node` runs one of its scripts.
A missing `node` or `npm`, or an install that fails, fails the test: it never skips.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

INSTALL_TIMEOUT_S = 600.0
"""Longest wait for `npm install` of one project (a cold cache downloads every package)."""


def npm_project(folder: Path) -> Path:
    """Install the npm project in `folder` (once: again only when its package.json changes) and return it.

    Concurrent callers (two test processes) wait for each other on a lock file beside it.
    """
    npm = _tool("npm")
    package = folder / "package.json"
    digest = hashlib.sha256(package.read_bytes()).hexdigest()
    stamp = folder / "node_modules" / ".installed-from"
    with open(folder / ".npm-install.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == digest:
            return folder
        command = [npm, "ci"] if (folder / "package-lock.json").exists() else [npm, "install"]
        done = subprocess.run(
            [*command, "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=folder,
            capture_output=True,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
        if done.returncode != 0:
            pytest.fail(f"npm could not install {folder.name}: {done.stderr.strip()[-2000:]}")
        stamp.write_text(digest)
    return folder


def run_node(
    folder: Path,
    script: str,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str] | None = None,
    timeout: float = 120.0,
) -> subprocess.CompletedProcess[str]:
    """Run `node <script> <args>` in the installed project `folder` and return its outcome (not checked)."""
    node = _tool("node")
    return subprocess.run(
        [node, script, *args],
        cwd=npm_project(folder),
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def json_lines(output: str) -> list[dict[str, object]]:
    """The JSON objects a script printed, one per line (other lines are ignored)."""
    found: list[dict[str, object]] = []
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{"):
            value = json.loads(line)
            if isinstance(value, dict):
                found.append(value)
    return found


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; the client-protocol tests need Node.js 20 and npm")
    return path
