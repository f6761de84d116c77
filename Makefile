.PHONY: demo test install lint
install:
	scripts/install.sh
demo:
	scripts/install.sh && .venv/bin/spotwise launch examples/tiny-gpt.yaml
test:
	scripts/install.sh --test && .venv/bin/ruff check src tests bench && .venv/bin/python -m pytest -q -p no:cacheprovider
# ruff (correctness rules) and mypy (config in pyproject.toml) over the code; mypy checks all of src.
lint:
	.venv/bin/ruff check src tests bench && .venv/bin/mypy
