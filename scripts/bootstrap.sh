#!/usr/bin/env bash
# Sets up everything mirrorflow needs on a fresh machine, idempotently, and prints the
# path of the Python environment. Heavy downloads are cached outside the checkout:
#   $MIRRORFLOW_CACHE (default ~/.cache/mirrorflow)/uv-<version>    the uv installer
#                                                   /venv-<hash of uv.lock>  the Python env
#                                                     (its modules compiled to bytecode once)
#                                                   /jars-<hash of jvm/*>    Maven artifacts
#                                                   /promtool-debian         Prometheus's promtool
# Java 17+, Maven and Chromium are installed from Debian's packages when missing (needs root).
set -euo pipefail
cd "$(dirname "$0")/.."
UV_VERSION=0.13.9
CACHE="${MIRRORFLOW_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mirrorflow}"
mkdir -p "$CACHE"
say() { echo "bootstrap: $*" >&2; }

need_apt=()
{ command -v java && command -v javac; } >/dev/null || need_apt+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null || need_apt+=(maven)
command -v python3.11 >/dev/null || command -v python3 >/dev/null || need_apt+=(python3)
# Debian's Chromium, for the browser test of the Airflow UI page (Playwright drives it; no
# browser is ever downloaded by a test tool). Installed as root only; others are told.
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then need_apt+=(chromium)
  else say "no /usr/bin/chromium: the UI browser test fails until root runs this script"; fi
fi
if ((${#need_apt[@]})); then
  if [ "$(id -u)" != 0 ]; then
    say "missing ${need_apt[*]}: install them (apt-get install ${need_apt[*]}) and retry"; exit 1
  fi
  say "installing ${need_apt[*]} from Debian's packages"
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >&2
fi
java_major=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/.*java.specification.version = \([0-9]*\).*/\1/p')
if [ "${java_major:-0}" -lt 17 ]; then say "Java 17 or newer is needed (found ${java_major:-none})"; exit 1; fi

UV="$CACHE/uv-$UV_VERSION/bin/uv"
if [ ! -x "$UV" ]; then
  say "installing uv $UV_VERSION into $CACHE/uv-$UV_VERSION"
  python3 -m venv "$CACHE/uv-$UV_VERSION"
  "$CACHE/uv-$UV_VERSION/bin/pip" install -q "uv==$UV_VERSION" >&2
fi

LOCK_HASH=$(cat uv.lock pyproject.toml | sha256sum | cut -c1-12)
VENV="$CACHE/venv-$LOCK_HASH"
if [ ! -f "$VENV/.complete" ]; then
  say "creating the Python environment $VENV from uv.lock"
  rm -rf "$VENV"
  UV_PROJECT_ENVIRONMENT="$VENV" "$UV" sync --locked --python python3.11 -q >&2
  touch "$VENV/.complete"
else
  # The checkout may have moved: the editable install must point at this one.
  UV_PROJECT_ENVIRONMENT="$VENV" "$UV" sync --locked --python python3.11 -q >&2
fi
if [ ! -f "$VENV/.bytecode" ]; then
  # Compiled once here, so that no Python process compiles pyspark's or Airflow's modules
  # again at each start (where PYTHONDONTWRITEBYTECODE is set, nothing would ever cache them).
  say "compiling the environment's modules to bytecode"
  "$VENV/bin/python" -m compileall -q -j 0 "$VENV/lib" >/dev/null 2>&1 || true
  touch "$VENV/.bytecode"
fi
say "resolving Kafka, Spark's Kafka connector and MirrorMaker 2 from Maven Central"
MIRRORFLOW_CACHE="$CACHE" "$VENV/bin/mirrorflow" jars >/dev/null

# --- tools built from the Go module proxy (optional: a few tests use them) ----------------------
# go_build WHAT DIR STEP NOTE: where Go is installed, runs the shell function STEP with Go's
# module and build caches in DIR.partial (STEP builds into "$build"), then moves the result to
# DIR and removes the caches. A failure only warns (NOTE says what then skips).
go_build() {
  local what=$1 dir=$2 step=$3 note=$4
  if ! command -v go >/dev/null; then
    say "no $what and no Go to build it: $note"
    return 0
  fi
  say "building $what from the Go module proxy into $dir"
  build="$dir.partial"
  rm -rf "$build" && mkdir -p "$build"
  if (
    export GOMODCACHE="$build/gomod" GOCACHE="$build/gocache" GOFLAGS=-modcacherw \
      CGO_ENABLED=0 GOTOOLCHAIN=local
    "$step"
  ) >"$dir.log" 2>&1; then
    rm -rf "$build/gomod" "$build/gocache" "$dir"
    mv "$build" "$dir"
  else
    rm -rf "$build"
    tail -5 "$dir.log" >&2
    say "warning: building $what failed (log: $dir.log): $note"
  fi
}

# docker compose: only the test that validates docker-compose.yaml needs it. Where a Docker
# client has no compose plugin, it goes to $CACHE/docker-compose-<version>/cli-plugins/
# docker-compose (1.5 to 2 minutes cold on 2 cores, ~30 MB stay). Use it with
# DOCKER_CONFIG=$CACHE/docker-compose-<version>. MIRRORFLOW_SKIP_COMPOSE=1 skips this step.
COMPOSE_VERSION=v5.5.1  # v5.6.0+ needs a dependency the Go module proxy does not serve
COMPOSE_DIR="$CACHE/docker-compose-$COMPOSE_VERSION"
build_compose() {
  local src
  src=$(go mod download -json "github.com/docker/compose/v5@$COMPOSE_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  # Built inside its own module (not `go install`): its go.mod has exclude directives.
  [ -n "$src" ] && cd "$src" && go build -trimpath \
    -ldflags "-s -w -X github.com/docker/compose/v5/internal.Version=$COMPOSE_VERSION" \
    -o "$build/cli-plugins/docker-compose" ./cmd
}
if [ -z "${MIRRORFLOW_SKIP_COMPOSE:-}" ] && command -v docker >/dev/null \
   && ! docker compose version >/dev/null 2>&1 \
   && [ ! -x "$COMPOSE_DIR/cli-plugins/docker-compose" ]; then
  go_build "docker compose $COMPOSE_VERSION" "$COMPOSE_DIR" build_compose \
    "the docker-compose.yaml test will skip"
fi

# promtool: Prometheus's, for tests/test_monitoring.py (`check rules` and `test rules` of
# monitoring/prometheus/mirrorflow-rules.yaml, the Grafana dashboard's queries). Where none is on
# the PATH, Debian's prometheus package is downloaded (not installed: no Prometheus server is set
# up or started) and only its promtool extracted to $CACHE/promtool-debian/promtool (seconds,
# ~60 MB); without apt, it is built from the Go module proxy into $CACHE/promtool-<version>
# (Prometheus 3's module versions are v0.3XX.Y for v3.XX.Y; many minutes cold on 2 cores).
# MIRRORFLOW_SKIP_PROMTOOL=1 skips this step.
PROMTOOL_VERSION=v3.16.0 PROMTOOL_MODULE_VERSION=v0.316.0
PROMTOOL_DIR="$CACHE/promtool-$PROMTOOL_VERSION"
PROMTOOL_DEB_DIR="$CACHE/promtool-debian"
build_promtool() {
  GOBIN="$build" go install -trimpath -ldflags "-s -w" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_MODULE_VERSION"
}
promtool_from_debian() {
  command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || return 1
  local work
  work=$(mktemp -d)
  (cd "$work" && { apt-get download -qq prometheus 2>/dev/null \
    || { [ "$(id -u)" = 0 ] && apt-get update -qq && apt-get download -qq prometheus 2>/dev/null; }; }) \
    && dpkg-deb -x "$work"/prometheus_*.deb "$work/x" \
    && mkdir -p "$PROMTOOL_DEB_DIR" && cp "$work/x/usr/bin/promtool" "$PROMTOOL_DEB_DIR/promtool"
  rm -rf "$work"
  [ -x "$PROMTOOL_DEB_DIR/promtool" ]
}
if [ -z "${MIRRORFLOW_SKIP_PROMTOOL:-}" ] && ! command -v promtool >/dev/null \
   && [ ! -x "$PROMTOOL_DEB_DIR/promtool" ] && [ ! -x "$PROMTOOL_DIR/promtool" ]; then
  say "taking promtool from Debian's prometheus package into $PROMTOOL_DEB_DIR"
  promtool_from_debian || go_build "promtool $PROMTOOL_VERSION" "$PROMTOOL_DIR" build_promtool \
    "the promtool checks of monitoring/ will skip"
fi
echo "$VENV"
