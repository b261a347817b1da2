#!/usr/bin/env bash
# Installs the host packages siesta needs, only those that are missing.
# Idempotent; run as root on Debian 12 (make up / make test call it).
set -euo pipefail

# Command -> Debian package. A command already on PATH (from any package,
# e.g. a newer qemu-img from backports) is not reinstalled.
declare -A NEED=(
  [qemu-system-x86_64]=qemu-system-x86
  [qemu-img]=qemu-utils
  [busybox]=busybox-static
  [cpio]=cpio
  [mkfs.ext4]=e2fsprogs
  [debootstrap]=debootstrap
  [nft]=nftables
  [ip]=iproute2
  [python3]=python3
  [curl]=curl
)

missing=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
done
# python3 -m venv needs its own package on Debian.
python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
# busybox from busybox-static is needed (a dynamic busybox cannot run in the initramfs).
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)

if [ ${#missing[@]} -gt 0 ]; then
  echo "siesta: installing host packages: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "siesta: these packages are missing and installing them needs root: ${missing[*]}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "siesta: cargo (Rust toolchain) not found on PATH; install Rust (rustup) first" >&2
  exit 1
fi
