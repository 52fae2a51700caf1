"""The server answers as its OpenAPI document says: a bounded schemathesis run of every check against it.

Schemathesis reads `/openapi.json` and sends each operation valid and invalid requests
(and undeclared methods, and sequences that follow the links between operations), then
checks every answer against the document: its status is documented, its body and content
type match, invalid input is refused and valid input is not, nothing is a 500. The run is
bounded (`schemathesis.toml`: examples per operation and a time budget) and seeded, so it
is the same run each time; `AGENT_RUNNER_TEST_SCHEMATHESIS_SEED` explores another one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.api_server import ApiServer
from tests.integration.api.api_server import serve

pytestmark = pytest.mark.integration

SCHEMATHESIS = str(Path(sys.executable).with_name("st"))
"""The `st` command of the virtual environment running the tests."""
CONFIG = Path(__file__).with_name("schemathesis.toml")
KEY = "openapi-check-key-0123456789"
TOKEN_SECRET = "openapi-check-token-secret-0123456789abcdef"
SEED = os.environ.get("AGENT_RUNNER_TEST_SCHEMATHESIS_SEED", "1")
RUN_TIMEOUT_S = 240.0
"""Well above the run's own budget (`max-time` in the config), which it keeps unless it hangs."""


@pytest.fixture(scope="module")
def server(server_dir: Path) -> Iterator[ApiServer]:
    """A server with an API key, so that the document's 401s are real, and tokens enabled."""
    yield from serve(server_dir, AGENT_RUNNER_API_KEYS=f"acme:{KEY}", AGENT_RUNNER_TOKEN_SECRET=TOKEN_SECRET)


def test_every_answer_of_the_server_is_one_its_openapi_document_describes(server: ApiServer, tmp_path: Path) -> None:
    # Given the server's document
    operations = sum(len(methods) for methods in httpx.get(f"{server.url}/openapi.json").json()["paths"].values())
    # When schemathesis runs every check over every operation (in a folder of its own, where
    # it keeps its example database and reports)
    command = [SCHEMATHESIS, "--config-file", str(CONFIG), "run", f"{server.url}/openapi.json"]
    result = subprocess.run(
        [*command, "--checks", "all", "--seed", SEED, "--no-color"],
        cwd=tmp_path,
        env={**os.environ, "AGENT_RUNNER_TEST_API_KEY": KEY},
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    report = result.stdout + result.stderr
    # Then it found nothing, and it tested every operation of the document
    found = report[report.find("=== ERRORS ===") if "=== ERRORS ===" in report else report.find("=== FAILURES ===") :]
    assert result.returncode == 0, f"schemathesis (seed {SEED}) found:\n{found[-25000:]}"
    tested = re.search(r"Tested: (\d+)", report)
    assert tested is not None and int(tested.group(1)) == operations, report[-3000:]
    assert "Server error" not in report
