#!/usr/bin/env bash
# Offline checks of deploy/ (make deploy-check). No Kubernetes control plane
# and no running systemd are needed, and none is used:
#   1. every file in deploy/k8s/ against the Kubernetes API schemas of the
#      versions below, strictly (an unknown field fails), with
#      kubernetes-validate from $DEPLOY_VENV; a file that holds no resource,
#      or a resource it has no schema for (a misspelt apiVersion, say, which
#      the tool only warns about), fails too;
#   2. the siesta.toml of the ConfigMap read by siesta's own parser
#      ($SIESTA_BIN, when it is built: an unknown key or a wrong type fails);
#   3. deploy/siesta.service with `systemd-analyze verify`, any complaint
#      about the unit (an unknown key or value, which it only logs) failing.
set -euo pipefail
cd "$(dirname "$0")/../.."

venv=${DEPLOY_VENV:-.venv-deploy}
siesta=${SIESTA_BIN:-target/release/siesta}
# The oldest Kubernetes still commonly run, and the newest this
# kubernetes-validate ships (tests/deploy/requirements.txt).
versions=(1.30.0 1.37.0)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. Kubernetes manifests.
kargs=()
for v in "${versions[@]}"; do kargs+=(-k "$v"); done
failed=0
shopt -s nullglob
files=(deploy/k8s/*)
if [ ${#files[@]} -eq 0 ]; then
  echo "deploy-check: no files in deploy/k8s" >&2
  exit 1
fi
for f in "${files[@]}"; do
  rc=0
  out=$("$venv/bin/kubernetes-validate" --strict "${kargs[@]}" "$f" 2>&1) || rc=$?
  printf '%s\n' "$out"
  if [ "$rc" -ne 0 ] || grep -qv '^INFO .* passed for resource ' <<<"$out" || [ -z "$out" ]; then
    echo "deploy-check: FAILED: $f" >&2
    failed=1
  fi
done
[ "$failed" -eq 0 ] || exit 1

# 2. The ConfigMap's siesta.toml, parsed by siesta (every command reads the
# configuration file first; `template list` on an empty home does no more).
"$venv/bin/python" - deploy/k8s/10-configmap.yaml "$tmp/siesta.toml" <<'PY'
import sys, yaml
doc = yaml.safe_load(open(sys.argv[1]))
open(sys.argv[2], "w").write(doc["data"]["siesta.toml"])
PY
if [ -x "$siesta" ]; then
  mkdir "$tmp/home"
  if ! SIESTA_HOME="$tmp/home" SIESTA_CONFIG="$tmp/siesta.toml" "$siesta" template list >/dev/null; then
    echo "deploy-check: FAILED: siesta.toml in deploy/k8s/10-configmap.yaml" >&2
    exit 1
  fi
  echo "INFO siesta.toml of deploy/k8s/10-configmap.yaml read by $siesta"
else
  echo "SKIP siesta.toml of deploy/k8s/10-configmap.yaml: $siesta is not built (make build)"
fi

# 3. The systemd unit. verify checks that ExecStart's program is
# executable: a copy with siesta's install path swapped for a stand-in that
# exists here is verified, so a unit naming any other path still fails.
if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "deploy-check: systemd-analyze is missing (Debian package systemd; make test-deps installs it)" >&2
  exit 1
fi
unit=deploy/siesta.service
if ! grep -q '^ExecStart=/usr/local/bin/siesta serve' "$unit"; then
  echo "deploy-check: $unit does not run /usr/local/bin/siesta serve" >&2
  exit 1
fi
sed 's|^ExecStart=/usr/local/bin/siesta |ExecStart=/usr/bin/true |' "$unit" >"$tmp/siesta.service"
rc=0
out=$(systemd-analyze verify "$tmp/siesta.service" 2>&1) || rc=$?
if [ "$rc" -ne 0 ] || grep -q 'siesta\.service' <<<"$out"; then
  printf '%s\n' "$out" >&2
  echo "deploy-check: FAILED: systemd-analyze verify $unit" >&2
  exit 1
fi
echo "INFO $unit passed systemd-analyze verify ($(systemd-analyze --version | head -1))"
