"""Templates from OCI images (issue 10): a real registry on 127.0.0.1
(Debian's docker-registry) serves a Debian image made without Docker (the
debootstrap tree `make assets` caches, as one layer of an OCI layout, pushed
with skopeo). The SDK's `Template().from_image(...)` builds from it with
every kind of step and a start command; sandboxes of the template must show
the image's config and the steps' effects. A second build finds the layer
cached; unknown images and too small disks fail clearly and leave nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid

import pytest
from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import BuildException

from server import REAL_HOME
from images import Registry, layout_from_tree_tar, push, tree_tar

IMAGE_CONFIG = {
    "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "IMAGE_VAR=from-image"],
    "WorkingDir": "/srv",
    "Cmd": ["/bin/bash"],
    "ExposedPorts": {"8080/tcp": {}},
}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def image(siesta, tmp_path_factory):
    tar = tree_tar(REAL_HOME)
    if tar is None:
        pytest.fail(f"no debootstrap tree tarball in {REAL_HOME}/cache: run `make assets`")
    work = tmp_path_factory.mktemp("oci")
    layout = layout_from_tree_tar(tar, work / "layout", "tools", IMAGE_CONFIG)
    registry = Registry(work / "registry").start()
    try:
        ref = registry.name("test/debian:tools")
        push(layout, "tools", ref)
        yield ref
    finally:
        registry.stop()
        # The pushed layer is hundreds of MiB: not left for pytest to rotate.
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def built(image, api, tmp_path_factory):
    ctx = tmp_path_factory.mktemp("context")
    (ctx / "hello.txt").write_text("hello from COPY\n")
    name = _name("oci")
    template = (
        Template(file_context_path=str(ctx))
        .from_image(image)
        .run_cmd("echo built-from-image > /etc/siesta-built", user="root")
        .set_envs({"STEP_VAR": "from-step"})
        .copy("hello.txt", "/srv/app/hello.txt", user="user")
        .set_workdir("/srv/app")
        .set_user("user")
        .set_start_cmd("python3 -m http.server 8080 --bind 127.0.0.1", wait_for_port(8080))
    )
    logs = []
    Template.build(template, name, on_build_logs=logs.append)
    yield name, template, logs
    api.delete(f"/templates/{name}")


def test_image_and_steps_shape_the_sandbox(built):
    name, _, logs = built
    messages = " ".join(e.message for e in logs)
    assert "1 pulled" in messages, messages
    sbx = Sandbox.create(name)
    try:
        run = sbx.commands.run
        assert run("cat /etc/siesta-built").stdout.strip() == "built-from-image"
        assert sbx.files.read("/srv/app/hello.txt") == "hello from COPY\n"
        assert run("stat -c %U /srv/app/hello.txt").stdout.strip() == "user"
        # The image's Env is the template's, with the steps' ENV on top.
        assert run("echo $IMAGE_VAR $STEP_VAR").stdout.strip() == "from-image from-step"
        assert run("pwd").stdout.strip() == "/srv/app"
        assert run("whoami").stdout.strip() == "user"
        assert run("id -u").stdout.strip() == "1000"
        assert run("sudo -n true").exit_code == 0
        # Running right after create, not started again.
        assert run("pgrep -f 'http.server 8080'").exit_code == 0
        code = run("curl -s -o /dev/null -w '%{http_code}' localhost:8080").stdout
        assert code == "200"
        assert run("python3 -c 'import json,ssl; print(1)'").stdout.strip() == "1"
    finally:
        sbx.kill()


def test_template_api_reports_the_image_template(built, api):
    name, _, _ = built
    got = api.get(f"/templates/{name}")
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["diskSizeMB"] > 1024, body
    assert body["buildStatus"] == "ready", body


def test_second_build_uses_the_cached_layer(built):
    name, template, _ = built
    logs = []
    Template.build(template, name, on_build_logs=logs.append)
    messages = " ".join(e.message for e in logs)
    assert "0 pulled" in messages and "1 cached" in messages, messages
    assert "unchanged since the last build" in messages, messages


def test_unknown_image_is_a_clear_error_and_leaves_nothing(image, api):
    repo, _ = image.rsplit(":", 1)
    name = _name("missing")
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image(f"{repo}:no-such-tag"), name)
    assert "not found" in str(err.value) and "no-such-tag" in str(err.value), str(err.value)
    assert api.get(f"/templates/{name}").status_code == 404


def test_too_small_disk_from_the_cli(siesta, image):
    env = dict(os.environ, SIESTA_HOME=str(siesta.home))
    name = _name("small")
    cmd = [str(siesta.binary), "template", "build", name, "--image", image, "--disk-mib", "100"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    assert "too small" in done.stderr and "ask for at least" in done.stderr, done.stderr
    listed = subprocess.run([str(siesta.binary), "template", "list"], env=env,
                            capture_output=True, text=True, check=True).stdout
    assert name not in listed
