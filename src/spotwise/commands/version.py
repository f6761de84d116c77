"""``spotwise version``."""

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json


@COMMANDS.register("version")
def register(app: typer.Typer) -> None:
    @app.command("version", help="Print the spotwise version.")
    def version(fmt: Format = format_option()) -> None:
        from spotwise import __version__

        if fmt is Format.json:
            print_json({"version": __version__})
        else:
            print(__version__)
