# A private PostgreSQL cluster for compose and the tests (sourced by compose/onboarding).
#
# The cluster lives in one directory under a data directory: `initdb` on first use, then
# `pg_ctl start` on a loopback port, so it neither needs nor touches Debian's own cluster (port
# 5432). Its Unix socket is in that directory too, and the URL points there (a round trip through
# it costs less than through TCP), unless the path is too long for a socket (over 90 characters). PostgreSQL refuses to run as root: when
# compose runs as root, the directory belongs to the `postgres` user that Debian's package
# creates, and the cluster runs as that user. Connections are trusted on loopback and the socket
# only (`--auth=trust`): it is a laptop's or a test's cluster, never a production one.

# Where Debian puts the server's programs (initdb, pg_ctl, postgres); the newest version wins.
pg_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$dir" ] && [ -x "$dir/initdb" ] && printf '%s\n' "$dir"
}

# Installs Debian's postgresql when its programs are missing.
ensure_postgres() {
  pg_bin >/dev/null && return 0
  note "installing postgresql with apt-get (the PostgreSQL store and its tests need it)"
  apt_install postgresql || fail "could not install postgresql; install it by hand (apt-get install postgresql) and try again"
  pg_bin >/dev/null || fail "postgresql was installed, but no initdb was found under /usr/lib/postgresql/*/bin"
}

# Runs a command as the cluster's owner: the postgres user when compose runs as root.
pg_as_owner() {
  if [ "$(id -u)" -eq 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# pg_start DIR PORT: starts the cluster in DIR (made on first use) on 127.0.0.1:PORT and prints
# its URL. Fails with the server's log when it does not start.
pg_start() {
  local dir=$1 port=$2 bin socket=
  bin=$(pg_bin) || fail "no PostgreSQL server programs: install Debian's postgresql (apt-get install postgresql)"
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    fail "something already listens on 127.0.0.1:$port, where the PostgreSQL cluster in $dir would; stop it or choose another port (ONBOARDING_TEST_POSTGRES_PORT for the tests)"
  fi
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
  if [ "$(id -u)" -eq 0 ]; then
    chown postgres: "$dir" && chmod 700 "$dir"
    runuser -u postgres -- test -x "$dir" \
      || fail "the postgres user cannot reach $dir (a folder above it is closed to other users); put the repository where others may enter, or run as an ordinary user"
  fi
  if [ ! -f "$dir/PG_VERSION" ]; then
    note "making a PostgreSQL cluster in $dir" >&2
    pg_as_owner "$bin/initdb" -D "$dir" -U onboarding --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir.initdb.log" 2>&1 \
      || fail "initdb failed; see $dir.initdb.log"
  fi
  [ ${#dir} -le 90 ] && socket=$dir
  if ! pg_as_owner "$bin/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 \
    -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories='$socket' -c synchronous_commit=on -c max_connections=200" start >/dev/null; then
    tail -20 "$dir/server.log" >&2
    fail "PostgreSQL did not start in $dir on port $port (its log is above)"
  fi
  pg_as_owner "$bin/createdb" -h 127.0.0.1 -p "$port" -U onboarding onboarding 2>/dev/null || true
  printf 'postgresql://onboarding@127.0.0.1:%s/onboarding%s\n' "$port" "${socket:+?host=$socket}"
}

# pg_stop DIR: stops the cluster in DIR, if it runs.
pg_stop() {
  local dir=$1 bin
  bin=$(pg_bin) || return 0
  [ -f "$dir/postmaster.pid" ] || return 0
  pg_as_owner "$bin/pg_ctl" -D "$dir" -m fast -w stop >/dev/null 2>&1 || true
}

# Clusters this script started, stopped when it exits (pg_stop_started, set as the EXIT trap by
# pg_started). pg_start runs in a command substitution, so its caller records the directory.
PG_STARTED=()
pg_stop_started() {
  local dir
  for dir in "${PG_STARTED[@]}"; do pg_stop "$dir"; done
}

# pg_started DIR: stop the cluster in DIR when the script exits, however it exits.
pg_started() {
  PG_STARTED+=("$1")
  trap pg_stop_started EXIT
}
