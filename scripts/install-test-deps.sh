#!/usr/bin/env bash
# Installs what only the tests need (make test calls it after
# install-deps.sh): an OCI registry server and the tools that make and push
# images without Docker, htpasswd for a registry that needs a password,
# openssl for the egress tests' HTTPS listener, systemd-analyze (package
# systemd) for make deploy-check's verify of deploy/siesta.service, etcd
# (package etcd-server) for the cluster tests' 3-member etcd, and
# Node.js with npm for the JS SDK's test (only when no node is installed: the
# machine's own, newer one is never replaced). Idempotent; run as root on Debian 12.
#
# Debian's docker-registry package ships a service that listens on :5000 on
# every interface. The tests start their own registry on 127.0.0.1 with
# their own configuration, so a service this script installed is stopped
# and disabled again right away.
set -euo pipefail

declare -A NEED=(
  [docker-registry]=docker-registry
  [skopeo]=skopeo
  [umoci]=umoci
  [htpasswd]=apache2-utils
  [openssl]=openssl
  [node]=nodejs
  [npm]=npm
  [systemd-analyze]=systemd
  [etcd]=etcd-server
)
missing=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${NEED[$cmd]}")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "siesta: installing ${missing[*]} needs root; run this as root or install them yourself" >&2
    exit 1
  fi
  echo "siesta: installing test packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
  case " ${missing[*]} " in
  *" docker-registry "*)
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
      echo "siesta: disabling the docker-registry service the package started (tests run their own on 127.0.0.1)"
      systemctl disable --now docker-registry.service >/dev/null 2>&1 || true
    fi ;;
  esac
  case " ${missing[*]} " in
  *" etcd-server "*)
    # Same for etcd: the tests start their own members on 127.0.0.1.
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
      systemctl disable --now etcd.service >/dev/null 2>&1 || true
    fi ;;
  esac
fi
still=()
for cmd in "${!NEED[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || still+=("$cmd (package ${NEED[$cmd]})")
done
if [ ${#still[@]} -gt 0 ]; then
  echo "siesta: still missing after installing:" >&2
  printf '  %s\n' "${still[@]}" >&2
  exit 1
fi
