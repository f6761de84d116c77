"""``spotwise serve``: the scheduler + HTTP API + dashboard + metrics in one process."""

from __future__ import annotations

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json


@COMMANDS.register("serve")
def register(app: typer.Typer) -> None:
    @app.command("serve", help="Run the scheduler and the HTTP API/dashboard/metrics (Ctrl-C stops).")
    def serve_cmd(
        host: str = typer.Option("127.0.0.1", "--host", help="address to listen on"),
        port: int = typer.Option(8600, "--port", min=1, max=65535, help="TCP port"),
        tick: float = typer.Option(5.0, "--tick", min=0.1, help="seconds between scheduler passes"),
        fmt: Format = format_option(help="json: first print where the server listens as one JSON document "
                                         "(for scripts); table: the log lines only."),
    ) -> None:
        import sys

        from spotwise.service.server import serve

        if fmt is Format.json:
            print_json({"url": f"http://{host}:{port}", "host": host, "port": port, "tick_seconds": tick})
            sys.stdout.flush()
        serve(host, port, tick_seconds=tick)
