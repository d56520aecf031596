# The two commands a new user needs (README): `make demo` and `make test`.
.PHONY: demo test lint format bootstrap docs
# The cached environment is shared by every checkout with the same lock: this checkout's code
# comes first on the path, whichever checkout last installed itself there.
export PYTHONPATH := $(CURDIR)

demo:
	@venv=$$(MIRRORFLOW_SKIP_COMPOSE=1 MIRRORFLOW_SKIP_PROMTOOL=1 scripts/bootstrap.sh) && PATH=$$venv/bin:$$PATH $$venv/bin/mirrorflow demo

# pytest in TEST_WORKERS processes (pytest-xdist), a test file each at a time, each process with
# its own Kafka clusters, Airflow home and state (TEST_WORKERS=0: one process, no xdist).
# After pytest: no process of the run may be left (tests/leftovers.py ends and names them).
TEST_WORKERS ?= 4
test:
	@venv=$$(scripts/bootstrap.sh) && $$venv/bin/ruff check . && $$venv/bin/ruff format --check . && \
	run=mirrorflow-test-run-$$$$-$$(date +%s%N) && \
	{ MIRRORFLOW_TEST_RUN=$$run PATH=$$venv/bin:$$PATH $$venv/bin/python -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS); status=$$?; \
	  $$venv/bin/python -m tests.leftovers $$run || status=1; exit $$status; }

lint:
	@venv=$$(scripts/bootstrap.sh) && $$venv/bin/ruff check . && $$venv/bin/ruff format --check . && $$venv/bin/python -m mypy

format:
	@venv=$$(scripts/bootstrap.sh) && $$venv/bin/ruff format . && $$venv/bin/ruff check --fix .

bootstrap:
	@scripts/bootstrap.sh

# The docs (README.md, docs/, benchmarks/README.md) as HTML, warnings as errors, as tests/test_docs.py builds them.
docs:
	@venv=$$(scripts/bootstrap.sh) && $$venv/bin/python -m sphinx -b html -W --keep-going -q -d .mirrorflow/docs/doctrees . .mirrorflow/docs/html && echo ".mirrorflow/docs/html/docs/index.html"
