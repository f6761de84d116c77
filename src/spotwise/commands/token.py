"""``spotwise token create|list|revoke``: API tokens (stored as SHA-256; shown once)."""

from __future__ import annotations

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_table


@COMMANDS.register("token")
def register(app: typer.Typer) -> None:
    tok = typer.Typer(help="API tokens for `spotwise serve`.", no_args_is_help=True)

    @tok.command("create", help="Create a token and print it (only its hash is stored).")
    def create(name: str = typer.Option("default", "--name", help="a label for the token"),
               fmt: Format = format_option()) -> None:
        from spotwise.service.auth import create_token

        t = create_token(name)
        if fmt is Format.json:
            print_json({"name": name, "token": t})
        else:
            print(t)

    @tok.command("list", help="Tokens (names and hash prefixes; never the tokens).")
    def list_(fmt: Format = format_option()) -> None:
        from spotwise.service.auth import list_tokens

        rows = list_tokens()
        if fmt is Format.json:
            print_json(rows)
        else:
            print_table(rows, ["id", "name", "sha256_prefix", "revoked"], title="API tokens")

    @tok.command("revoke", help="Revoke a token by id.")
    def revoke(token_id: int = typer.Argument(..., help="id from `spotwise token list`"),
               fmt: Format = format_option()) -> None:
        from spotwise.service.auth import revoke as do

        do(token_id)
        print_json({"revoked": token_id}) if fmt is Format.json else print(f"revoked token {token_id}")

    app.add_typer(tok, name="token")
