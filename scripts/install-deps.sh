#!/usr/bin/env bash
# Installs the host packages siesta needs, only those that are missing, then
# checks that every command is really there. Idempotent; run as root on
# Debian 12 (make up / make test call it).
#
# QEMU's packages are installed together, at one version from one suite:
# qemu-system-x86 depends on qemu-system-common of its own version, and apt
# removes a qemu-utils of another version (say 10.x from backports) to make
# room. A qemu-img on PATH is therefore no reason to skip qemu-utils: it is
# only kept when it already has the version qemu-system-x86 will have.
set -euo pipefail

# Command -> Debian package that provides it.
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

installed_version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || true; }
installed_ok() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# The version qemu-system-x86 has (installed) or will have (candidate).
qemu_version() {
  if installed_ok qemu-system-x86; then
    installed_version qemu-system-x86
  else
    apt-cache policy qemu-system-x86 2>/dev/null | awk '/Candidate:/ {print $2}'
  fi
}

missing=()
for cmd in "${!NEED[@]}"; do
  case "${NEED[$cmd]}" in qemu-system-x86 | qemu-utils) continue ;; esac
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
done
# python3 -m venv needs its own package on Debian.
python3 -c 'import ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
# busybox from busybox-static is needed (a dynamic busybox cannot run in the initramfs).
installed_ok busybox-static || missing+=(busybox-static)

need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    echo "siesta: installing $* needs root; run this as root or install them yourself" >&2
    exit 1
  fi
}

export DEBIAN_FRONTEND=noninteractive
updated=0
apt_update_once() {
  if [ "$updated" -eq 0 ]; then
    apt-get update -qq
    updated=1
  fi
}

# QEMU: both packages at one version, or nothing to do.
qemu_pkgs_ok() {
  installed_ok qemu-system-x86 && installed_ok qemu-utils &&
    [ "$(installed_version qemu-system-x86)" = "$(installed_version qemu-utils)" ]
}
if ! qemu_pkgs_ok; then
  need_root qemu-system-x86 qemu-utils
  apt_update_once
  ver=$(qemu_version)
  if [ -z "$ver" ] || [ "$ver" = "(none)" ]; then
    echo "siesta: no installable qemu-system-x86 found in the configured apt sources" >&2
    exit 1
  fi
  echo "siesta: installing qemu-system-x86 and qemu-utils, both at $ver" \
    "(was: qemu-utils $(installed_version qemu-utils || true))"
  apt-get install -y -qq --no-install-recommends --allow-downgrades \
    "qemu-system-x86=$ver" "qemu-utils=$ver"
fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "siesta: installing host packages: ${missing[*]}"
  need_root "${missing[@]}"
  apt_update_once
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Sandbox host names `{port}-{id}.localhost:3000` (what the SDK's
# get_host() gives with siesta's default domain) resolve to this machine
# through nss-myhostname, which answers for every name under `.localhost`.
if ! installed_ok libnss-myhostname; then
  need_root libnss-myhostname
  apt_update_once
  echo "siesta: installing libnss-myhostname (names under .localhost resolve to this machine)"
  apt-get install -y -qq --no-install-recommends libnss-myhostname
fi
if ! grep -Eq '^hosts:.*[[:space:]]myhostname([[:space:]]|$)' /etc/nsswitch.conf; then
  need_root "myhostname in /etc/nsswitch.conf"
  echo "siesta: adding myhostname to the hosts line of /etc/nsswitch.conf"
  sed -i -E 's/^(hosts:[[:space:]]*.*files)([[:space:]]|$)/\1 myhostname\2/' /etc/nsswitch.conf
fi

# Installing one package can remove another (see above): check again, and
# name the command and the package of anything still missing.
still_missing=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || still_missing+=("$cmd (package ${NEED[$cmd]})")
done
python3 -c 'import ensurepip' >/dev/null 2>&1 || still_missing+=("python3 -m venv (package python3-venv)")
getent hosts 1-check.localhost >/dev/null 2>&1 ||
  still_missing+=("names under .localhost do not resolve (package libnss-myhostname, and myhostname on the hosts line of /etc/nsswitch.conf)")
qemu_pkgs_ok || still_missing+=("qemu-system-x86 and qemu-utils at one version (have $(installed_version qemu-system-x86) and $(installed_version qemu-utils))")
if [ ${#still_missing[@]} -gt 0 ]; then
  echo "siesta: still missing after installing:" >&2
  printf '  %s\n' "${still_missing[@]}" >&2
  exit 1
fi

if ! command -v cargo >/dev/null 2>&1; then
  echo "siesta: cargo (Rust toolchain) not found on PATH; install Rust (rustup) first" >&2
  exit 1
fi
