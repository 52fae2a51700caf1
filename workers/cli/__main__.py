"""`python -m workers.cli`: the `agent-runner` command line."""

from workers.cli import main

main()
