"""The one error type the CLI turns into a one-line message and exit code 2."""
import click


class FbtError(click.ClickException):
    """Bad input or a refused operation. The message names the file/field and what was expected.

    It is a `click.ClickException` so that typer/click print it as one line and exit with code 2,
    also under `typer.testing.CliRunner`; library callers catch it as an ordinary exception.
    """

    exit_code = 2

    def show(self, file=None) -> None:  # one plain line, no rich panel
        click.echo(f"error: {self.format_message()}", err=True)
