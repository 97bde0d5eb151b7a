#!/usr/bin/env bash
# Builds the Citus extension from source and installs it into Debian's PostgreSQL 15,
# for the Citus suite (tests/citus.sh), `make chaos CHAOS_ARGS=--citus` and the
# `--citus` benchmarks. Debian does not package Citus.
#
#   CITUS_SOURCE=/path/to/citus-13.2.2-src.tar.gz tests/citus/build.sh   (or make citus)
#
# CITUS_SOURCE names the Citus source: a release tarball (.tar.gz) or an unpacked
# source directory. It is the only input from outside this clone.
#
# - When the installed citus.so is already the source's version, nothing is done.
# - With CITUS_SOURCE unset, an installed Citus (any version) is used as it is; without
#   one the script says what to set and exits 1.
# - Missing Debian packages (the PostgreSQL 15 server and headers, a compiler, the
#   libraries Citus links) are installed with apt-get. apt-get and `make install` need
#   root: run by another user, the script builds as that user and runs those two
#   with sudo.
# - The build tree is kept in .cyclone/citus/citus-VERSION (CITUS_BUILD_DIR moves it):
#   installing the same version again for the same PostgreSQL (after the extension's
#   files were removed, say) only runs `make install`. `make clean` removes it with the
#   rest of .cyclone.
# - PG15_BIN names the PostgreSQL bin directory (default /usr/lib/postgresql/15/bin).
#
# The first build takes a few minutes (two and a half on two cores). Citus is AGPL-3.0:
# a tool the tests run against, never part of Cyclone's code or packages.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${PG15_BIN:-/usr/lib/postgresql/15/bin}
cache=${CITUS_BUILD_DIR:-$root/.cyclone/citus}
source=${CITUS_SOURCE:-}

say() { echo "citus: $*"; }
die() { echo "citus: $*" >&2; exit 1; }

# The version compiled into an installed citus.so ("Citus 13.2.2 on ..."), or nothing.
installed_version() {
    local lib
    lib=$("$bin/pg_config" --pkglibdir 2>/dev/null || echo "$bin/../lib")
    [[ -f $lib/citus.so ]] || return 0
    grep -a -o -m1 'Citus [0-9][0-9.]*[0-9]' "$lib/citus.so" | head -n1 | cut -d' ' -f2
}

# The version a source declares in its configure script (PACKAGE_VERSION='13.2.2').
source_version() {
    local line
    if [[ -d $source ]]; then
        line=$(grep -m1 "^PACKAGE_VERSION=" "$source/configure" 2>/dev/null || true)
    else
        line=$(tar -xzOf "$source" --wildcards '*/configure' 2>/dev/null \
            | grep -m1 "^PACKAGE_VERSION=" || true)
    fi
    line=${line#*=}
    echo "${line//\'/}"
}

have=$(installed_version)
if [[ -z $source ]]; then
    if [[ -n $have ]]; then
        say "Citus $have is installed for PostgreSQL 15 (CITUS_SOURCE is not set: nothing to build)"
        exit 0
    fi
    die "Citus is not installed for PostgreSQL 15: set CITUS_SOURCE to a Citus source tarball or directory (CITUS_SOURCE=/path/to/citus-13.2.2-src.tar.gz make citus)"
fi
[[ -e $source ]] || die "CITUS_SOURCE=$source does not exist"
source=$(realpath "$source")
version=$(source_version)
[[ -n $version ]] || die "CITUS_SOURCE=$source has no configure script with a PACKAGE_VERSION: not a Citus source"
if [[ $have == "$version" ]]; then
    say "Citus $version is already installed for PostgreSQL 15"
    exit 0
fi

# Run a command as root: directly when we are root, else through sudo.
as_root() {
    if [[ $(id -u) == 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null; then
        sudo "$@"
    else
        die "$1 needs root, and there is no sudo: run tests/citus/build.sh as root"
    fi
}

# Debian's packages for building an extension of PostgreSQL 15: only those missing.
packages=(postgresql-15 postgresql-server-dev-15 build-essential autoconf flex bison
    libcurl4-openssl-dev liblz4-dev libzstd-dev libkrb5-dev libssl-dev libselinux1-dev
    libxslt1-dev libpam0g-dev libreadline-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
[[ -x $bin/pg_config ]] || die "$bin/pg_config not found: set PG15_BIN to PostgreSQL 15's bin directory"

tree=$cache/citus-$version
stamp=$tree/.cyclone-built
built_for="$("$bin/pg_config" --version) $("$bin/pg_config" --includedir-server)"
if [[ -f $stamp && $(cat "$stamp") == "$built_for" ]]; then
    say "reusing the build of Citus $version in $tree"
else
    say "building Citus $version in $tree (a few minutes)"
    rm -rf "$tree"
    mkdir -p "$tree"
    if [[ -d $source ]]; then
        cp -a "$source/." "$tree/"
    else
        tar -xzf "$source" -C "$tree" --strip-components=1
    fi
    # Debian's PostgreSQL 15 carries a backported have_createdb_privilege() in
    # commands/dbcommands.h, while Citus's compatibility header defines its own static
    # one for PostgreSQL 15: the two clash. When the server exports it, drop Citus's
    # definition (a `static inline bool` line, then the name, through the closing brace).
    compat=$tree/src/include/pg_version_compat.h
    if grep -q "extern bool have_createdb_privilege" "$("$bin/pg_config" --includedir-server)/commands/dbcommands.h" \
        && [[ -f $compat ]]; then
        awk '
            held != "" && /^have_createdb_privilege\(void\)/ { skipping = 1; held = ""; next }
            held != "" { print held; held = "" }
            skipping { if ($0 == "}") skipping = 0; next }
            $0 == "static inline bool" { held = $0; next }
            { print }
            END { if (held != "") print held }
        ' "$compat" >"$compat.new"
        mv "$compat.new" "$compat"
    fi
    (cd "$tree" && PG_CONFIG=$bin/pg_config ./configure >configure.out 2>&1) \
        || { tail -n 30 "$tree/configure.out" >&2; die "configure failed (log: $tree/configure.out)"; }
    make -C "$tree" -j"$(nproc)" >"$tree/make.out" 2>&1 \
        || { tail -n 30 "$tree/make.out" >&2; die "make failed (log: $tree/make.out)"; }
    echo "$built_for" >"$stamp"
fi

say "installing Citus $version into $("$bin/pg_config" --pkglibdir)"
as_root make -C "$tree" install >"$tree/install.out" 2>&1 \
    || { tail -n 30 "$tree/install.out" >&2; die "make install failed (log: $tree/install.out)"; }
say "Citus $(installed_version) installed for PostgreSQL 15"
