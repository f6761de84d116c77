.PHONY: demo test install lint
install:
	scripts/install.sh
demo:
	scripts/install.sh && .venv/bin/spotwise launch examples/tiny-gpt.yaml
# lint first (about a minute): a lint or type error fails CI before the suite starts. Then the suite
# in two phases: the fast tests on three pytest-xdist workers that take whole files (a module's
# fixtures are paid once), then the tests marked slow (each starts Ray clusters) on two workers, also
# by file, longest first (tests/conftest.py orders them; --no-loadscope-reorder keeps that order, where
# xdist would start the files with the most tests first and could leave a long one for the end). Both
# phases keep the 2 cores busy: a slow test's cost is the Ray processes it starts (docs/architecture.md,
# "The test suite", with the measurements). The slow phase prints its 20 longest entries: where a CI
# run's minutes went, without another run.
# Measured: a clean clone of 4dc31dc (2026-11-27, third session) took 36.9 min (slow tests one at a
# time: 24.7 min); a clean clone of f07e5b2 (fourth session, 15:19-15:46 UTC): 27.2 min (install and
# lint 2.2, fast 6.4, slow two at a time 19.5); the same slow tests on the idle machine before it:
# 14.2 min; a clean clone of 088e974 (16:25 UTC): 35.5 min, its slow tests 1.7-2.7x as long as in
# the idle run (load average 13). A clean clone of f563aa1 (twelfth session, a faster machine):
# 17.3 min of tests (fast 4.8, slow two at a time 12.5), under the 20 minutes; machines differ by
# up to 1.6x from session to session (docs/architecture.md, "The test suite").
# env -u PYTHONDONTWRITEBYTECODE: where it is set (as on the machines here), pytest rewrote the
# asserts of all ~450 test modules in every process (5 xdist workers over the two phases, and the
# tests' own pytest runs), about 6 CPU-s each: the rewritten modules are cached in __pycache__ now.
PYTEST = env -u PYTHONDONTWRITEBYTECODE .venv/bin/python -m pytest -q -p no:cacheprovider
test:
	scripts/install.sh --test && $(MAKE) --no-print-directory lint \
	  && $(PYTEST) -n 3 --dist loadfile -m "not slow" \
	  && $(PYTEST) -n 2 --dist loadfile --no-loadscope-reorder -m slow --durations=20
# ruff (config in pyproject.toml) over src, tests and bench; mypy over src (its config too).
lint:
	.venv/bin/ruff check src tests bench && .venv/bin/mypy
