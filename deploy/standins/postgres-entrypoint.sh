#!/bin/sh
# First start: a cluster owned by POSTGRES_USER with POSTGRES_PASSWORD, a database POSTGRES_DB, password logins
# from the container network. Later starts: the cluster as it is.
set -eu
user="${POSTGRES_USER:-postgres}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$user" --encoding=UTF8 --locale=C.UTF-8 --pwfile="$pwfile" --auth=scram-sha-256 -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
    db="${POSTGRES_DB:-$user}"
    if [ "$db" != "postgres" ]; then
        pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w start >/dev/null
        PGPASSWORD="$POSTGRES_PASSWORD" createdb --username="$user" --maintenance-db=postgres "$db"
        pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
    fi
fi
exec postgres -D "$PGDATA" -c listen_addresses='*'
