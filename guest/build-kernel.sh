#!/usr/bin/env bash
# build-kernel.sh OUTDIR
#
# Fetches Debian's cloud kernel package (linux-image-<abi>-cloud-amd64-unsigned,
# the one the metapackage linux-image-cloud-amd64 currently points at) and
# extracts what a siesta guest needs:
#   OUTDIR/vmlinuz          the kernel
#   OUTDIR/kernel-version   its release string (uname -r)
#   OUTDIR/modules/*.ko     the virtio modules and their dependencies (plain .ko)
#   OUTDIR/modules/order    module file names, one a line, in load order
# Idempotent: does nothing when all of these exist. Delete OUTDIR/vmlinuz to
# fetch the current kernel again. SIESTA_KERNEL_PKG=name overrides the package.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"

[ $# -eq 1 ] || die "usage: $0 OUTDIR"
out=$1

# Modules the initramfs loads (dependencies are added from modules.dep):
# virtio for the disk and NIC, nfsv3 for volumes (mounted from the host over
# NFSv3). Loaded at boot, so every template snapshot has them.
WANTED="virtio virtio_ring virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci virtio_blk failover net_failover virtio_net nfsv3"

if [ -s "$out/vmlinuz" ] && [ -s "$out/kernel-version" ] && [ -s "$out/modules/order" ] \
    && [ "$(cat "$out/modules/wanted" 2>/dev/null)" = "$WANTED" ]; then
    log "kernel: $out/vmlinuz present ($(cat "$out/kernel-version")), skipping"
    exit 0
fi
need_root
need_cmd dpkg-deb dpkg

# Resolve the package name: metapackage dependency -> <that>-unsigned, or the
# signed image itself (same vmlinuz and modules), or the newest one apt knows.
resolve_pkg() {
    local dep cand
    dep=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null \
          | awk '/Depends: linux-image-[0-9].*-cloud-amd64/ {print $2; exit}')
    for cand in ${dep:+"$dep-unsigned" "$dep"}; do
        if apt-cache show "$cand" >/dev/null 2>&1; then echo "$cand"; return 0; fi
    done
    apt-cache pkgnames linux-image- 2>/dev/null \
        | grep -E '^linux-image-[0-9][0-9.]*-[0-9]+-cloud-amd64-unsigned$' \
        | sort -V | tail -n1
}
pkg=${SIESTA_KERNEL_PKG:-}
if [ -z "$pkg" ]; then
    pkg=$(resolve_pkg || true)
    if [ -z "$pkg" ]; then apt_update; pkg=$(resolve_pkg || true); fi
fi
[ -n "$pkg" ] || die "cannot find a linux-image-*-cloud-amd64 package (is a Debian main mirror in apt sources?)"

tmp=$(mktemp -d /tmp/siesta-kernel.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
chmod 755 "$tmp"   # apt-get download runs as _apt and must write here
chown _apt "$tmp" 2>/dev/null || true

log "kernel: downloading $pkg"
if ! (cd "$tmp" && apt-get download "$pkg" >&2); then
    apt_update
    (cd "$tmp" && apt-get download "$pkg" >&2) || die "apt-get download $pkg failed"
fi
deb=$(ls "$tmp"/*.deb 2>/dev/null | head -n1)
[ -n "$deb" ] || die "apt-get download produced no .deb"
dpkg-deb -x "$deb" "$tmp/x"

vmlinuz=$(ls "$tmp"/x/boot/vmlinuz-* 2>/dev/null | head -n1)
[ -n "$vmlinuz" ] || die "$pkg has no boot/vmlinuz-*"
kver=${vmlinuz##*/vmlinuz-}
moddir=$tmp/x/lib/modules/$kver
[ -d "$moddir" ] || die "$pkg has no lib/modules/$kver"
# The package ships no modules.dep (the postinst runs depmod): make one.
if [ ! -f "$moddir/modules.dep" ]; then
    need_cmd depmod kmod
    depmod -b "$tmp/x" "$kver" || die "depmod failed for $kver"
fi
[ -f "$moddir/modules.dep" ] || die "no modules.dep for $kver"

# Order: depth-first over modules.dep, dependencies before dependents.
# Built-in modules (modules.builtin) are skipped; unknown ones are fatal.
declare -A dep_of=() path_of=() done_=()
while IFS= read -r line; do
    p=${line%%:*}; deps=${line#*:}
    n=${p##*/}; n=${n%%.ko*}; n=${n//-/_}
    path_of[$n]=$p
    dl=""
    for d in $deps; do d=${d##*/}; d=${d%%.ko*}; dl="$dl ${d//-/_}"; done
    dep_of[$n]=$dl
done < "$moddir/modules.dep"
builtin=" $(sed -e 's#.*/##' -e 's/\.ko.*//' -e 's/-/_/g' "$moddir/modules.builtin" 2>/dev/null | tr '\n' ' ') "

order=()
visit() {
    local m=$1 d
    [ -n "${done_[$m]:-}" ] && return 0
    done_[$m]=1
    if [ -z "${path_of[$m]:-}" ]; then
        case "$builtin" in *" $m "*) log "kernel: $m is built in"; return 0;; esac
        die "module $m is neither in modules.dep nor built into $kver"
    fi
    for d in ${dep_of[$m]}; do visit "$d"; done
    order+=("$m")
}
for m in $WANTED; do visit "$m"; done

mkdir -p "$out"
rm -rf "$out/modules.tmp"
mkdir -p "$out/modules.tmp"
for m in "${order[@]}"; do
    src=$moddir/${path_of[$m]}
    dst=$out/modules.tmp/$m.ko
    case "$src" in
        *.ko)     cp "$src" "$dst" ;;
        *.ko.xz)  need_cmd xz xz-utils; xz -dc "$src" > "$dst" ;;
        *.ko.zst) need_cmd zstd zstd;   zstd -qdc "$src" > "$dst" ;;
        *.ko.gz)  gzip -dc "$src" > "$dst" ;;
        *) die "unknown module format: $src" ;;
    esac
    echo "$m.ko" >> "$out/modules.tmp/order"
done
echo "$WANTED" > "$out/modules.tmp/wanted"
rm -rf "$out/modules"
mv "$out/modules.tmp" "$out/modules"
echo "$kver" > "$out/kernel-version.tmp"
cp "$vmlinuz" "$out/vmlinuz.tmp"
touch "$out/vmlinuz.tmp" "$out/modules"/*   # mtime = now, so dependents rebuild
mv "$out/kernel-version.tmp" "$out/kernel-version"
mv "$out/vmlinuz.tmp" "$out/vmlinuz"       # last: its presence marks completion
log "kernel: $kver -> $out (modules: ${order[*]})"
