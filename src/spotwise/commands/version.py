"""``spotwise version``."""

import typer


def register(app: typer.Typer) -> None:
    @app.command("version", help="Print the spotwise version.")
    def version() -> None:
        from spotwise import __version__

        print(__version__)
