"""The one error type the CLI turns into a one-line message and exit code 2."""

try:  # typer >= 0.2x vendors click; its own ClickException is the one its runner handles
    from typer._click.exceptions import ClickException
    from typer._click.utils import echo
except ImportError:  # pragma: no cover - older typer uses click itself
    from click import ClickException, echo


class FbtError(ClickException):
    """Bad input or a refused operation. The message names the file/field and what was expected.

    It is a ClickException so that typer prints it as one line and exits with code 2, also under
    `typer.testing.CliRunner`; library callers catch it as an ordinary exception.
    """

    exit_code = 2

    def show(self, file=None) -> None:  # one plain line
        echo(f"error: {self.format_message()}", err=True)
