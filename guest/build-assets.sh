#!/usr/bin/env bash
# build-assets.sh [TARGET...]
#
# Builds the guest assets into $SIESTA_HOME/assets (SIESTA_HOME defaults to
# /var/lib/siesta):
#   kernel       vmlinuz, kernel-version, modules/   (build-kernel.sh)
#   initramfs    initramfs.img                       (build-initramfs.sh)
#   rootfs-base  rootfs-base.img  Debian 12 minbase  (build-rootfs.sh base)
#   rootfs-tiny  rootfs-tiny.img  busybox            (build-rootfs.sh tiny)
#   siesta-agent the static agent (with AGENT_BIN), for builds from images
# Default: all four. The rootfs targets need AGENT_BIN (path to the static
# siesta-agent). A target is skipped when its output is newer than all of its
# inputs (scripts, modules, agent binary) and, for the images, the agent's
# SHA-256 matches the one recorded in IMG.stamp; so running this twice is fast.
# Set SIESTA_FORCE=1 to rebuild the initramfs and images anyway.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root

SIESTA_HOME=${SIESTA_HOME:-/var/lib/siesta}
export SIESTA_HOME
assets=$SIESTA_HOME/assets
mkdir -p "$assets" "$SIESTA_HOME/cache"

targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(kernel initramfs rootfs-base rootfs-tiny)
for t in "${targets[@]}"; do
    case "$t" in
        kernel|initramfs) ;;
        rootfs-base|rootfs-tiny)
            [ -n "${AGENT_BIN:-}" ] || die "AGENT_BIN is not set (path to the static siesta-agent); needed for $t"
            [ -f "$AGENT_BIN" ] || die "AGENT_BIN=$AGENT_BIN does not exist"
            AGENT_BIN=$(cd "$(dirname "$AGENT_BIN")" && pwd)/$(basename "$AGENT_BIN") ;;
        *) die "unknown target '$t' (kernel, initramfs, rootfs-base, rootfs-tiny)" ;;
    esac
done

# One builder at a time per SIESTA_HOME (make up and make test may overlap).
exec 9> "$assets/.lock"
if ! flock -n 9; then
    log "another build-assets.sh holds $assets/.lock, waiting"
    flock 9
fi

# up_to_date OUT INPUT...: OUT exists and no existing INPUT is newer.
up_to_date() {
    local out=$1 f; shift
    [ "${SIESTA_FORCE:-0}" = 1 ] && return 1
    [ -e "$out" ] || return 1
    for f in "$@"; do
        [ -e "$f" ] || continue
        [ "$f" -nt "$out" ] && { log "$(basename "$out"): $f is newer, rebuilding"; return 1; }
    done
    return 0
}

bb=/bin/busybox; [ -e "$bb" ] || bb=/usr/bin/busybox
for t in "${targets[@]}"; do
    case "$t" in
    kernel)
        "$here/build-kernel.sh" "$assets" ;;
    initramfs)
        [ -s "$assets/modules/order" ] || "$here/build-kernel.sh" "$assets"
        if up_to_date "$assets/initramfs.img" "$here/build-initramfs.sh" "$here/lib.sh" \
                "$assets/vmlinuz" "$assets/modules/order" "$assets"/modules/*.ko "$bb"; then
            log "initramfs: $assets/initramfs.img up to date"
        else
            log "initramfs: building $assets/initramfs.img"
            "$here/build-initramfs.sh" "$assets" "$assets/initramfs.img"
        fi ;;
    rootfs-base|rootfs-tiny)
        kind=${t#rootfs-}
        img=$assets/rootfs-$kind.img
        extra=()
        [ "$kind" = tiny ] && extra=("$bb")
        # The agent is compared by content (a stamp beside the image), not
        # only by mtime: an older binary must still replace a different one.
        stamp="agent-sha256 $(sha256sum < "$AGENT_BIN" | cut -d' ' -f1)"
        if up_to_date "$img" "$here/build-rootfs.sh" "$here/lib.sh" "$AGENT_BIN" "${extra[@]}" \
                && [ "$(cat "$img.stamp" 2>/dev/null)" = "$stamp" ]; then
            log "rootfs $kind: $img up to date"
        else
            log "rootfs $kind: building $img with agent $AGENT_BIN"
            rm -f "$img.stamp"
            "$here/build-rootfs.sh" "$kind" "$img" "$AGENT_BIN"
            echo "$stamp" > "$img.stamp"
        fi ;;
    esac
done
# The agent itself, for templates built from OCI images (they get it
# injected at build time).
if [ -n "${AGENT_BIN:-}" ] && ! cmp -s "$AGENT_BIN" "$assets/siesta-agent"; then
    log "agent: installing $assets/siesta-agent"
    install -m 0755 "$AGENT_BIN" "$assets/siesta-agent.tmp"
    mv "$assets/siesta-agent.tmp" "$assets/siesta-agent"
fi
log "assets in $assets:"
ls -l "$assets" | sed 's/^/[guest]   /' >&2
