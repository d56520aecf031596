# The two commands a new user needs (README): `make demo` and `make test`.
.PHONY: demo test lint format bootstrap
# The cached environment is shared by every checkout with the same lock: this checkout's code
# comes first on the path, whichever checkout last installed itself there.
export PYTHONPATH := $(CURDIR)

demo:
	@venv=$$(MIRRORFLOW_SKIP_COMPOSE=1 MIRRORFLOW_SKIP_PROMTOOL=1 scripts/bootstrap.sh) && PATH=$$venv/bin:$$PATH $$venv/bin/mirrorflow demo

test:
	@venv=$$(scripts/bootstrap.sh) && $$venv/bin/ruff check . && $$venv/bin/ruff format --check . && PATH=$$venv/bin:$$PATH $$venv/bin/python -m pytest $(PYTEST_ARGS)

lint:
	@venv=$$(scripts/bootstrap.sh) && $$venv/bin/ruff check . && $$venv/bin/ruff format --check .

format:
	@venv=$$(scripts/bootstrap.sh) && $$venv/bin/ruff format . && $$venv/bin/ruff check --fix .

bootstrap:
	@scripts/bootstrap.sh
