# The two commands a new user needs (README): `make demo` and `make test`.
.PHONY: demo test lint format bootstrap

demo:
	@venv=$$(scripts/bootstrap.sh) && PATH=$$venv/bin:$$PATH $$venv/bin/mirrorflow demo

test:
	@venv=$$(scripts/bootstrap.sh) && $$venv/bin/ruff check . && $$venv/bin/ruff format --check . && PATH=$$venv/bin:$$PATH $$venv/bin/python -m pytest $(PYTEST_ARGS)

lint:
	@venv=$$(scripts/bootstrap.sh) && $$venv/bin/ruff check . && $$venv/bin/ruff format --check .

format:
	@venv=$$(scripts/bootstrap.sh) && $$venv/bin/ruff format . && $$venv/bin/ruff check --fix .

bootstrap:
	@scripts/bootstrap.sh
