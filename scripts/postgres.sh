#!/usr/bin/env bash
# Starts a throwaway PostgreSQL server from the machine's binaries (installing
# them with apt-get when missing), as the postgres user when run as root.
#
#   scripts/postgres.sh start PORT DIR   # prints a connection URL when ready
#   scripts/postgres.sh stop DIR
set -euo pipefail
# Any failure not handled below still says where and what failed.
trap 'echo "postgres.sh: failed (exit $?) at line $LINENO: $BASH_COMMAND" >&2' ERR

find_bin() {
	if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
	ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1
}

as_owner() {
	if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
start)
	port=${2:?port}; dir=${3:?dir}
	bin=$(find_bin)
	if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
		echo "postgres: no server binaries; installing with apt-get" >&2
		apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
		bin=$(find_bin)
	fi
	if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
		echo "postgres: no PostgreSQL server binaries (initdb, pg_ctl) found, and apt-get could not install them: install the postgresql package, or set DATABASE_URL to a server of your own" >&2
		exit 1
	fi
	mkdir -p "$dir" || { echo "postgres: cannot create $dir" >&2; exit 1; }
	if [ "$(id -u)" = 0 ]; then
		id postgres >/dev/null 2>&1 || useradd --system --home "$dir" postgres
		chown -R postgres "$dir"
		# Postgres refuses to run as root, so the postgres user runs it, and
		# must reach the directory through every parent of it.
		if ! runuser -u postgres -- test -w "$dir"; then
			echo "postgres: the postgres user cannot reach $dir: a parent directory is not searchable by it (chmod 755 the parents, or use a directory under /tmp)" >&2
			exit 1
		fi
	fi
	if ! as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --locale=C --no-sync >"$dir/initdb.log" 2>&1; then
		echo "postgres: initdb failed in $dir/data:" >&2
		cat "$dir/initdb.log" >&2
		exit 1
	fi
	as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
		-o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
		start >"$dir/pg_ctl.log" 2>&1 || { cat "$dir/pg_ctl.log" "$dir/server.log" >&2; exit 1; }
	echo "postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
	;;
stop)
	dir=${2:?dir}
	bin=$(find_bin)
	[ -d "$dir/data" ] && as_owner "$bin/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
	;;
*)
	echo "usage: $0 start PORT DIR | stop DIR" >&2
	exit 2
	;;
esac
