# Shared helpers for the guest-asset scripts. Source it; do not run it.
# shellcheck shell=bash

log() { printf '[guest] %s\n' "$*" >&2; }
die() { printf '[guest] ERROR: %s\n' "$*" >&2; exit 1; }

_apt_updated=0
# apt_install PKG...: install missing Debian packages (no recommends). Runs
# `apt-get update` once if a package cannot be found or fetched.
apt_install() {
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "need root to install: ${missing[*]}"
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
        apt_update
        apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 \
            || die "apt-get install failed: ${missing[*]}"
    fi
}

apt_update() {
    if [ "$_apt_updated" -eq 0 ]; then
        log "apt-get update"
        apt-get update -q >&2 || die "apt-get update failed"
        _apt_updated=1
    fi
}

# need_cmd CMD PKG: make sure CMD exists, installing PKG if not.
need_cmd() {
    command -v "$1" >/dev/null 2>&1 || apt_install "$2"
    command -v "$1" >/dev/null 2>&1 || die "command '$1' still missing after installing $2"
}

# need_root: these scripts create device-owned files, chroot and mkfs.
need_root() { [ "$(id -u)" -eq 0 ] || die "$(basename "$0") must run as root"; }

# busybox_static: path of a statically linked busybox (Debian busybox-static).
busybox_static() {
    apt_install busybox-static
    local bb=/bin/busybox
    [ -x "$bb" ] || bb=/usr/bin/busybox
    [ -x "$bb" ] || die "busybox-static installed but no busybox binary found"
    if command -v file >/dev/null 2>&1 && ! file -L "$bb" | grep -q 'statically linked'; then
        die "$bb is not statically linked (is busybox-static installed?)"
    fi
    printf '%s\n' "$bb"
}
