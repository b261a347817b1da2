#!/usr/bin/env bash
# selftest.sh [--tiny-only]
#
# Boots the guest kernel + initramfs under QEMU (TCG, q35, virtio disk and
# virtio-net) with a stand-in agent: a shell script installed as
# /usr/local/bin/siesta-agent that prints what it sees to the console and
# powers off. Checks that the initramfs found the disk, switch_root'ed into
# the agent with `--init`, that eth0 (virtio_net) exists and that
# `/bin/bash -l -c` works; on the base image also that `user` exists with
# /home/user and passwordless sudo. Kernel and initramfs come from
# $SIESTA_HOME/assets (built if missing); the test images are built in a temp
# dir (the base image from the cached debootstrap tarball).
# Env: SIESTA_ACCEL (default tcg), SIESTA_BOOT_TIMEOUT (default 60 s).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
need_root

kinds="tiny base"
case "${1:-}" in
    "") ;;
    --tiny-only) kinds=tiny ;;
    *) die "usage: $0 [--tiny-only]" ;;
esac
SIESTA_HOME=${SIESTA_HOME:-/var/lib/siesta}
export SIESTA_HOME
accel=${SIESTA_ACCEL:-tcg}
boot_timeout=${SIESTA_BOOT_TIMEOUT:-60}
assets=$SIESTA_HOME/assets
need_cmd qemu-system-x86_64 qemu-system-x86

"$here/build-assets.sh" kernel initramfs

tmp=$(mktemp -d /tmp/siesta-selftest.XXXXXX)
qpid=""
cleanup() {
    if [ -n "$qpid" ] && kill -0 "$qpid" 2>/dev/null; then kill "$qpid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# Stand-in agent. Runs as PID 1 under /bin/sh (busybox ash or dash).
cat > "$tmp/agent" <<'AGENT'
#!/bin/sh
say() { echo "$*" > /dev/console; }
say "AGENT-STARTED $* pid=$$ uptime=$(cut -d' ' -f1 /proc/uptime)"
hostname "$(cat /etc/hostname)"   # PID 1's job (sudo wants a resolvable name)
say "NET: $(ls /sys/class/net | tr '\n' ' ')"
say "BASH: $(/bin/bash -l -c 'echo ok $0' 2>&1)"
if command -v sudo >/dev/null 2>&1; then
    say "USER: $(sudo -u user -H /bin/bash -l -c 'echo $(id -un) $(id -u) $HOME' 2>&1)"
    say "SUDO: $(sudo -u user sudo -n /bin/sh -c 'id -un' 2>&1)"
else
    say "USER: $(grep '^user:' /etc/passwd | cut -d: -f1,3,6 | tr ':' ' ')"
fi
say "AGENT-DONE"
sync
if command -v poweroff >/dev/null 2>&1; then poweroff -f; fi
# No poweroff binary in Debian minbase: ask the kernel. Run sleep once first so
# its pages are cached before the disk goes away.
sleep 0
echo o > /proc/sysrq-trigger
sleep 30
AGENT
chmod 755 "$tmp/agent"

fail=0
check() {  # check LOG PATTERN DESCRIPTION
    if grep -qE "$2" "$1"; then
        log "  ok: $3"
    else
        log "  FAILED: $3 (no line matching /$2/)"; fail=1
    fi
}

for kind in $kinds; do
    img=$tmp/rootfs-$kind.img
    "$here/build-rootfs.sh" "$kind" "$img" "$tmp/agent"
    con=$tmp/console-$kind.log
    log "selftest $kind: booting ($accel, q35, timeout ${boot_timeout}s)"
    start=$(date +%s%N)
    qemu-system-x86_64 -accel "$accel" -M q35 -cpu max -m 512 -smp 1 \
        -nodefaults -vga none -display none -no-reboot \
        -kernel "$assets/vmlinuz" -initrd "$assets/initramfs.img" \
        -append 'console=ttyS0 quiet panic=-1' \
        -drive "file=$img,if=virtio,format=raw" \
        -netdev user,id=n0 -device virtio-net-pci,netdev=n0 \
        -serial stdio < /dev/null > "$con.raw" 2>&1 &
    qpid=$!
    timed_out=0
    while kill -0 "$qpid" 2>/dev/null; do
        if [ $(( ($(date +%s%N) - start) / 1000000000 )) -ge "$boot_timeout" ]; then
            timed_out=1; kill "$qpid" 2>/dev/null || true; break
        fi
        sleep 0.2
    done
    wait "$qpid" 2>/dev/null || true
    qpid=""
    ms=$(( ($(date +%s%N) - start) / 1000000 ))
    tr -d '\r' < "$con.raw" > "$con"
    sed "s/^/[console $kind] /" "$con" >&2
    [ "$timed_out" = 0 ] || { log "  FAILED: VM did not power off within ${boot_timeout}s"; fail=1; }
    check "$con" '^AGENT-STARTED --init pid=1 ' "agent ran as PID 1 with --init"
    check "$con" '^NET: .*eth0' "virtio_net interface eth0 present"
    check "$con" '^BASH: ok ' "/bin/bash -l -c works"
    if [ "$kind" = base ]; then
        check "$con" '^USER: user 1000 /home/user$' "user (1000, /home/user) via sudo -u user bash -l"
        check "$con" '^SUDO: root$' "user has passwordless sudo"
    else
        check "$con" '^USER: user 1000 /home/user$' "user (1000, /home/user) in /etc/passwd"
    fi
    check "$con" '^AGENT-DONE' "stand-in agent finished"
    log "selftest $kind: boot to power-off ${ms} ms"
done
[ "$fail" = 0 ] || die "selftest FAILED"
log "selftest passed ($kinds)"
