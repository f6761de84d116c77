"""``spotwise config show``: every setting's effective value and where it came from.

Where: ``env SPOTWISE_X`` (the environment wins), ``file PATH: key.path`` (the config file), or
``default`` (neither sets it: the code's default applies, named in the setting's help). Secrets
(API keys, a database URL's password) are masked. The Slurm clusters of the file follow.
"""

from __future__ import annotations

import typer

from spotwise.commands import COMMANDS
from spotwise.output import Format, format_option, print_json, print_table


def _report() -> dict:
    """What ``config show`` prints, as data (the JSON form)."""
    from spotwise import config

    path = config.config_path()
    cfg = config.load()                  # a bad file is an InputError here (exit 2), naming the field
    rows = []
    for s in config.SETTINGS:
        eff = config.effective(s.env)
        rows.append({"key": s.key, "env": s.env, "value": config.masked(eff), "source": eff.source,
                     "help": s.help})
    clusters = [c.model_dump() for c in cfg.slurm.clusters]
    return {"file": str(path), "file_exists": path.exists(), "settings": rows, "slurm": {"clusters": clusters}}


@COMMANDS.register("config")
def register(app: typer.Typer) -> None:
    grp = typer.Typer(help="spotwise's config file ($SPOTWISE_CONFIG or ~/.config/spotwise/config.yaml).",
                      no_args_is_help=True)

    @grp.command("show", help="Each setting's effective value (secrets masked) and where it came from: "
                              "the environment, the config file, or the default.")
    def show(fmt: Format = format_option()) -> None:
        data = _report()
        if fmt is Format.json:
            print_json(data)
            return
        state = "" if data["file_exists"] else " (not there: defaults and the environment only)"
        # the table says "file" (its path is in the title); JSON carries "file PATH: key" in full
        print_table([{**r, "value": "-" if r["value"] is None else r["value"],
                      "source": "file" if r["source"].startswith("file ") else r["source"]}
                     for r in data["settings"]],
                    ["key", "value", "source", "env"], optional=["env"],
                    title=f"settings (config file: {data['file']}{state})")
        clusters = data["slurm"]["clusters"]
        if clusters:
            print_table([{"cluster": c["name"], "partition": p, "usd_per_gpu_hour": f"{v['price_per_gpu_hour']:g}",
                          "slurm_conf": c["slurm_conf"] or "(Slurm's default)", "ssh": c["ssh"] or "(here)"}
                         for c in clusters for p, v in c["partitions"].items()],
                        ["cluster", "partition", "usd_per_gpu_hour", "slurm_conf", "ssh"], title="slurm clusters")
        else:
            print("slurm clusters: none (the config file's slurm.clusters)")

    app.add_typer(grp, name="config")
