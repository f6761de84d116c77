.PHONY: demo test install lint
install:
	scripts/install.sh
demo:
	scripts/install.sh && .venv/bin/spotwise launch examples/tiny-gpt.yaml
# lint first (about a minute): a lint or type error fails CI before the suite starts. The suite runs
# on three pytest-xdist workers (most of an end-to-end test is waiting on Ray, not computing); it
# takes about SUITE_MINUTES minutes on this 2-core machine (docs/architecture.md, "The test suite").
test:
	scripts/install.sh --test && $(MAKE) --no-print-directory lint && .venv/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_XDIST)
PYTEST_XDIST ?= -n 3 --dist loadgroup
# ruff (config in pyproject.toml) over src, tests and bench; mypy over src (its config too).
lint:
	.venv/bin/ruff check src tests bench && .venv/bin/mypy
