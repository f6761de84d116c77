.PHONY: demo test install lint
install:
	scripts/install.sh
demo:
	scripts/install.sh && .venv/bin/spotwise launch examples/tiny-gpt.yaml
# lint first (about a minute): a lint or type error fails CI before the suite (about 45 minutes on 2 cores) starts.
test:
	scripts/install.sh --test && $(MAKE) --no-print-directory lint && .venv/bin/python -m pytest -q -p no:cacheprovider
# ruff (config in pyproject.toml) over src, tests and bench; mypy over src (its config too).
lint:
	.venv/bin/ruff check src tests bench && .venv/bin/mypy
