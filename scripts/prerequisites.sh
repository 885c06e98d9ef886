# What the project's commands need from the machine beyond the locked Python environment, checked
# before the long work starts. Sourced by scripts/demo, scripts/test and .ci/run; each need either
# installs what is missing where it can (root with Debian's apt-get, as on CI machines) or says in
# one line what to install and how.

_can_apt() { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; }

_apt_install() {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

_java_major() {
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\)[."].*/\1/p' | head -1
}

# Spark 4 runs on Java 17 or later: spark-submit fails deep inside the first Spark task without it.
need_java() {
  local major
  major="$(command -v java >/dev/null 2>&1 && _java_major || true)"
  if [ -n "$major" ] && [ "$major" -ge 17 ]; then
    return 0
  fi
  if _can_apt; then
    echo "installing Java 17 for Spark (Debian package openjdk-17-jre-headless)" >&2
    _apt_install openjdk-17-jre-headless
    return 0
  fi
  echo "Spark needs Java 17 or later (found: ${major:-none}): install it, e.g. 'sudo apt-get install openjdk-17-jre-headless', then run this again" >&2
  exit 1
}

# Chromium (Debian's build) for the browser tests; without it they are skipped (failed under CI).
want_chromium() {
  if command -v chromium >/dev/null 2>&1; then
    return 0
  fi
  if _can_apt; then
    echo "installing Chromium for the browser tests (Debian package chromium)" >&2
    _apt_install chromium
    return 0
  fi
  echo "no chromium: the browser tests will be skipped; 'sudo apt-get install chromium' runs them" >&2
}

# The PostgreSQL at 127.0.0.1:5432 the tests need (trust auth); started if it stopped.
want_postgres() {
  if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    return 0
  fi
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && return 0; sleep 1; done
  fi
  echo "no PostgreSQL at 127.0.0.1:5432: the tests that need it will be skipped (failed under CI)" >&2
}
