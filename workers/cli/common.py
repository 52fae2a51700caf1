"""What every command of the command line shares: the exit statuses, the one-line errors, the command group.

Every error is one `error: ...` line on standard error (form data that fails its schema adds
one `  - ...` line per schema error), never a traceback: `Commands.main` turns whatever a
command raises into that line and its exit status.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn

import click

if TYPE_CHECKING:
    from agent_runner import AgentRunnerError

EXIT_BAD_INPUT = 2
EXIT_FAILURE = 1


def fail(message: str, code: int = EXIT_FAILURE, details: Iterable[str] = ()) -> NoReturn:
    """Print `error: message` (and one `  - detail` line per detail) on standard error and exit with `code`."""
    click.echo(f"error: {one_line(message)}", err=True)
    for line in details:
        click.echo(f"  - {one_line(line)}", err=True)
    sys.exit(code)


def one_line(text: str) -> str:
    """`text` on one line, passwords masked, and printable whatever bytes the arguments held."""
    from store.redaction import mask_url_secrets

    text = " ".join(mask_url_secrets(text).split())
    try:
        # Arguments that were not UTF-8 reach Python as lone surrogates: show their bytes.
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")


def exit_code(error: AgentRunnerError) -> int:
    """2 for bad input (an unknown turn, a command that does not fit the turn, a bad setting), else 1."""
    from agent_runner import AgentNotFound, DefinitionError, InputLimitError, TurnError
    from workers.settings import SettingsError

    # TurnError: an unknown turn, or a command that does not fit the turn.
    bad_input = (TurnError, InputLimitError, AgentNotFound, DefinitionError, SettingsError)
    return EXIT_BAD_INPUT if isinstance(error, bad_input) else EXIT_FAILURE


def fail_with(error: AgentRunnerError) -> NoReturn:
    """Exit for a runner error: 2 for bad input (unknown turn, a command that does not fit), else 1."""
    fail(str(error), exit_code(error), getattr(error, "errors", ()))


def unusable_url(url: str, error: Exception) -> NoReturn:
    """Exit 2 for a database URL that cannot be used."""
    fail(f"cannot use --database-url {url!r}: {type(error).__name__}: {error}", EXIT_BAD_INPUT)


def not_json(name: str) -> Any:
    """A `parse_constant` of `json.loads` that refuses NaN and the infinities."""
    raise ValueError(f"{name} is not a JSON value")


def json_object(text: str, option: str) -> dict[str, Any]:
    """The JSON object `text` holds; exits 2 naming `option` when it holds something else."""
    try:
        data = json.loads(text, parse_constant=not_json)
    except RecursionError:
        fail(f"{option} data is nested too deeply", EXIT_BAD_INPUT)
    except ValueError as exc:  # JSONDecodeError, and numbers too long to convert
        fail(f"{option} data is not valid JSON: {exc}", EXIT_BAD_INPUT)
    if not isinstance(data, dict):
        fail(f"{option} data must be a JSON object", EXIT_BAD_INPUT)
    return data


class Commands(click.Group):
    """The command group: whatever goes wrong in any command ends as one `error: ...` line."""

    def main(
        self,
        args: Any = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the command line; with `standalone_mode=False` errors are raised as click raises them."""
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            result = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as exc:
            exc.show()  # the help text, not an error
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            fail(exc.format_message(), EXIT_BAD_INPUT)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        except click.Abort:
            fail("aborted")
        except Exception as exc:
            from agent_runner import AgentRunnerError

            if isinstance(exc, AgentRunnerError):
                fail_with(exc)
            # An error no layer turned into a typed one: still one line, never a traceback.
            fail(f"{type(exc).__name__}: {exc}")
        sys.exit(result if isinstance(result, int) else 0)
