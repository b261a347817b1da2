#!/usr/bin/env bash
# build-rootfs.sh base|tiny OUT.img AGENT_BIN
#
# base: Debian 12 (bookworm) minbase from debootstrap, with bash, coreutils,
#       procps, sudo, ca-certificates and iproute2, then (apt-get in the tree)
#       python3 with pip and venv, curl, git, nodejs with npm, less, xz and
#       ssh; user `user` (uid 1000, /home/user, /bin/bash, passwordless
#       sudo), whose `pip install` and `npm install -g` go to ~/.local.
#       ext4, 2G by default (sparse).
#       The debootstrapped tree is cached as a tarball in $SIESTA_HOME/cache/,
#       so a rebuild only unpacks it, re-injects the agent and runs mkfs.
# tiny: busybox-static with applet links, /bin/sh and a /bin/bash wrapper
#       (so `/bin/bash -l -c CMD` works), root and `user` (1000). ext4, 64M.
# Both: AGENT_BIN is installed as /usr/local/bin/siesta-agent (0755); the
#       image is written to OUT.img.tmp and renamed into place.
#
# Environment:
#   SIESTA_HOME          default /var/lib/siesta (cache in $SIESTA_HOME/cache)
#   SIESTA_ROOTFS_SIZE   image size for mkfs.ext4 (default 2G base, 64M tiny)
#   SIESTA_DEBIAN_MIRROR Debian mirror (default: the one apt uses, else
#                        http://deb.debian.org/debian)
#   SIESTA_HOSTNAME      guest host name (default siesta)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

[ $# -eq 3 ] || die "usage: $0 base|tiny OUT.img AGENT_BIN"
kind=$1 out=$2 agent=$3
case "$kind" in base|tiny) ;; *) die "unknown rootfs kind '$kind' (base or tiny)";; esac
[ -f "$agent" ] || die "agent binary $agent not found"
[ -x "$agent" ] || die "agent binary $agent is not executable"
need_root
need_cmd mkfs.ext4 e2fsprogs

SIESTA_HOME=${SIESTA_HOME:-/var/lib/siesta}
HOSTNAME_=${SIESTA_HOSTNAME:-siesta}
SUITE=bookworm
INCLUDE=bash,coreutils,procps,sudo,ca-certificates,iproute2
# What agents' code expects of a default sandbox, installed with apt inside
# the debootstrapped tree (debootstrap's own resolver cannot install npm).
TOOLS="python3 python3-pip python3-venv curl git nodejs npm less xz-utils openssh-client"

if command -v file >/dev/null 2>&1 && file -L "$agent" | grep -q 'dynamically linked'; then
    [ "$kind" = tiny ] && die "$agent is dynamically linked; the tiny image has no libc (build it static)"
    log "warning: $agent is dynamically linked"
fi

tmp=$(mktemp -d /tmp/siesta-rootfs.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
r=$tmp/root
mkdir -p "$r"

# debian_mirror: the Debian archive apt already uses for $SUITE.
debian_mirror() {
    local m=""
    if [ -n "${SIESTA_DEBIAN_MIRROR:-}" ]; then echo "$SIESTA_DEBIAN_MIRROR"; return; fi
    local f
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [ -f "$f" ] || continue
        m=$(awk -v s="$SUITE" '
            $1 == "deb" {
                i = 2; if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
                if ($(i+1) == s) { print $i; exit }
            }' "$f")
        [ -n "$m" ] && break
    done
    if [ -z "$m" ]; then
        for f in /etc/apt/sources.list.d/*.sources; do
            [ -f "$f" ] || continue
            m=$(awk -v s="$SUITE" '
                function flush() {
                    if (types ~ /(^| )deb( |$)/ && enabled != "no" && (" " suites " ") ~ (" " s " ") && uri != "") { print uri; found = 1 }
                    types = ""; suites = ""; uri = ""; enabled = ""
                }
                /^[ \t]*#/ { next }
                /^[ \t]*$/ { flush(); if (found) exit; next }
                tolower($1) == "types:"   { types = $0; sub(/^[^:]*:[ \t]*/, "", types) }
                tolower($1) == "suites:"  { suites = $0; sub(/^[^:]*:[ \t]*/, "", suites) }
                tolower($1) == "uris:"    { uri = $2 }
                tolower($1) == "enabled:" { enabled = tolower($2) }
                END { if (!found) flush() }' "$f" | head -n1)
            [ -n "$m" ] && break
        done
    fi
    echo "${m:-http://deb.debian.org/debian}"
}

# install_tools DIR: apt-get install $TOOLS in the debootstrapped tree DIR,
# with the host's resolver for the download only.
install_tools() {
    local ds=$1
    cp -L /etc/resolv.conf "$ds/etc/resolv.conf"
    log "rootfs base: installing $TOOLS"
    if ! { chroot "$ds" apt-get update -qq &&
           DEBIAN_FRONTEND=noninteractive chroot "$ds" apt-get install -y -qq \
               --no-install-recommends $TOOLS; } > "$tmp/tools.log" 2>&1; then
        tail -n 30 "$tmp/tools.log" >&2
        die "installing $TOOLS in the guest tree failed"
    fi
    chroot "$ds" apt-get clean
}

build_base() {
    apt_install debootstrap debian-archive-keyring
    need_cmd tar tar
    local key cache mirror
    key=$(printf '%s %s minbase %s' "$SUITE" "$INCLUDE" "$TOOLS" | sha256sum | cut -c1-12)
    cache=$SIESTA_HOME/cache/debootstrap-$SUITE-minbase-$key.tar
    if [ ! -s "$cache" ]; then
        mirror=$(debian_mirror)
        log "rootfs base: debootstrap $SUITE from $mirror (cached afterwards in $cache)"
        local ds=$tmp/debootstrap
        mkdir -p "$ds"
        if ! debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$ds" "$mirror" \
                > "$tmp/debootstrap.log" 2>&1; then
            tail -n 30 "$tmp/debootstrap.log" >&2
            [ -f "$ds/debootstrap/debootstrap.log" ] && tail -n 30 "$ds/debootstrap/debootstrap.log" >&2
            die "debootstrap failed (mirror $mirror)"
        fi
        install_tools "$ds"
        # Leave nothing host-specific or bulky in the cached tree.
        rm -rf "$ds"/var/cache/apt/archives/*.deb "$ds"/var/lib/apt/lists/* \
               "$ds"/var/cache/apt/*.bin "$ds"/var/log/* "$ds"/debootstrap
        mkdir -p "$SIESTA_HOME/cache"
        tar --numeric-owner --xattrs --xattrs-include='*' -C "$ds" -cf "$cache.tmp" .
        mv "$cache.tmp" "$cache"
        rm -rf "$ds"
    else
        log "rootfs base: using cached debootstrap tree $cache"
    fi
    tar --numeric-owner --xattrs --xattrs-include='*' -xpf "$cache" -C "$r"

    # The login user the E2B SDK runs commands as.
    if ! chroot "$r" getent passwd user >/dev/null; then
        chroot "$r" useradd --create-home --home-dir /home/user --uid 1000 \
            --user-group --shell /bin/bash user || die "useradd in chroot failed"
    fi
    mkdir -p "$r/etc/sudoers.d"
    echo 'user ALL=(ALL:ALL) NOPASSWD: ALL' > "$r/etc/sudoers.d/90-siesta-user"
    chmod 0440 "$r/etc/sudoers.d/90-siesta-user"
    # `pip install` is the first thing an agent runs. Debian marks its
    # Python externally managed (PEP 668) and pip then refuses; a sandbox
    # is disposable, so pip may install: as `user` into ~/.local (pip's
    # user install, site-packages being root's), as root into /usr/local.
    printf '[global]\nbreak-system-packages = true\n' > "$r/etc/pip.conf"
    # `npm install -g` as `user` goes to ~/.local too (root keeps
    # /usr/local). ~/.local/bin exists from the start, so the login
    # shell's ~/.profile puts it on PATH for every command.
    printf 'prefix=/home/user/.local\n' > "$r/home/user/.npmrc"
    mkdir -p "$r/home/user/.local/bin"
    chown -R 1000:1000 "$r/home/user/.npmrc" "$r/home/user/.local"
    # Host resolver settings must not leak into the guest; the runtime or
    # agent writes the guest's own.
    rm -f "$r/etc/resolv.conf"; : > "$r/etc/resolv.conf"
    # No fstab entries: the initramfs mounts the root and moves /proc etc.
    printf '# root is mounted by the siesta initramfs\n' > "$r/etc/fstab"
    size=${SIESTA_ROOTFS_SIZE:-2G}
}

build_tiny() {
    local bb a
    bb=$(busybox_static)
    mkdir -p "$r"/{bin,sbin,usr/bin,usr/sbin,usr/local/bin,etc,proc,sys,dev,run,tmp,var/tmp,root,home/user}
    cp "$bb" "$r/bin/busybox"
    # --list-full gives each applet's usual place (bin/ls, usr/sbin/...).
    for a in $("$bb" --list-full); do
        [ "${a##*/}" = busybox ] && continue
        [ -e "$r/$a" ] || ln -s /bin/busybox "$r/$a"
    done
    [ -e "$r/bin/sh" ] || ln -s /bin/busybox "$r/bin/sh"
    # busybox has no `bash` applet, so a symlink would not run; a wrapper does.
    printf '#!/bin/sh\nexec /bin/sh "$@"\n' > "$r/bin/bash"
    chmod 0755 "$r/bin/bash"
    cat > "$r/etc/passwd" <<'P'
root:x:0:0:root:/root:/bin/sh
user:x:1000:1000:user:/home/user:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
P
    cat > "$r/etc/group" <<'G'
root:x:0:
sudo:x:27:user
user:x:1000:
nogroup:x:65534:
G
    cat > "$r/etc/shadow" <<'S'
root:*:19000:0:99999:7:::
user:*:19000:0:99999:7:::
nobody:*:19000:0:99999:7:::
S
    chmod 0640 "$r/etc/shadow"
    cat > "$r/etc/profile" <<'PR'
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
[ -n "$HOME" ] || export HOME=/root
PR
    : > "$r/etc/resolv.conf"
    chmod 1777 "$r/tmp" "$r/var/tmp"
    chmod 0700 "$r/root"
    chown 1000:1000 "$r/home/user"
    size=${SIESTA_ROOTFS_SIZE:-64M}
}

size=""
"build_$kind"

# Common to both: identity files and the agent.
echo "$HOSTNAME_" > "$r/etc/hostname"
cat > "$r/etc/hosts" <<H
127.0.0.1	localhost
127.0.1.1	$HOSTNAME_
::1	localhost ip6-localhost ip6-loopback
H
: > "$r/etc/machine-id"     # empty: whatever runs first generates its own
mkdir -p "$r/usr/local/bin"
install -m 0755 -o 0 -g 0 "$agent" "$r/usr/local/bin/siesta-agent"

mkdir -p "$(dirname "$out")"
rm -f "$out.tmp"
truncate -s "$size" "$out.tmp" || die "cannot create $out.tmp"
log "rootfs $kind: mkfs.ext4 $size from $(du -sh "$r" | cut -f1) of files"
mkfs.ext4 -q -F -d "$r" -L siesta-root "$out.tmp" "$size" \
    || die "mkfs.ext4 -d failed (is $size big enough? set SIESTA_ROOTFS_SIZE)"
mv "$out.tmp" "$out"
log "rootfs $kind: $out ($size)"
