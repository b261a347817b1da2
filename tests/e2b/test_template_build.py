"""Template builds through the E2B SDK's `Template` builder (issue 10).

A template is built with RUN, ENV, COPY, WORKDIR and USER steps and a
start command from the `base` template, then a sandbox is created from its
name: the copied file, the environment, the working directory, the user
and the start command's process must all be there. Builds are real: a VM
boots on a copy of base's disk, the steps run in it, it is frozen.
"""

from __future__ import annotations

import os
import uuid

import httpx
import pytest
from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import BuildException


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _api(siesta):
    return httpx.Client(
        base_url=os.environ["E2B_API_URL"],
        headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
        timeout=30,
    )


@pytest.fixture(scope="module")
def built(siesta, tmp_path_factory):
    """One template with every kind of step, shared by the checks below."""
    ctx = tmp_path_factory.mktemp("context")
    (ctx / "app").mkdir()
    (ctx / "app" / "hello.txt").write_text("hello from COPY\n")
    (ctx / "app" / "run.sh").write_text("#!/bin/sh\necho run\n")
    name = _name("steps")
    logs = []
    template = (
        Template(file_context_path=str(ctx))
        .from_template("base")
        .set_envs({"GREETING": "hi there"})
        .run_cmd("echo step-output-marker && echo built > /etc/siesta-built", user="root")
        .copy("app", "/opt/app", user="user", mode=0o755)
        .set_workdir("/opt/app")
        .run_cmd("pwd > where.txt")
        .set_user("worker")
        .run_cmd("whoami > /tmp/build-user")
        .set_start_cmd("python3 -m http.server 8000 --bind 127.0.0.1", wait_for_port(8000))
    )
    Template.build(template, name, on_build_logs=logs.append)
    yield name, logs
    with _api(siesta) as api:
        api.delete(f"/templates/{name}")


def test_steps_shape_the_sandbox(built):
    name, logs = built
    messages = [e.message for e in logs]
    assert any("step-output-marker" in m for m in messages), messages
    sbx = Sandbox.create(name)
    try:
        run = sbx.commands.run
        assert run("cat /etc/siesta-built").stdout.strip() == "built"
        assert sbx.files.read("/opt/app/hello.txt") == "hello from COPY\n"
        # COPY's owner and mode apply to what it copied.
        stat = run("stat -c '%U %a' /opt/app/hello.txt /opt/app/run.sh").stdout.split("\n")
        assert stat[:2] == ["user 755", "user 755"], stat
        # WORKDIR made the directory; the RUN after it ran there.
        assert run("cat /opt/app/where.txt").stdout.strip() == "/opt/app"
        # The last USER and WORKDIR are the sandbox's defaults; ENV is kept.
        assert run("whoami").stdout.strip() == "worker"
        assert run("pwd").stdout.strip() == "/opt/app"
        assert run("echo $GREETING").stdout.strip() == "hi there"
        assert run("cat /tmp/build-user").stdout.strip() == "worker"
        # The start command was running when the template was frozen, so it
        # is running right after create, without being started again.
        out = run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/")
        assert out.stdout.strip() == "200"
    finally:
        sbx.kill()


def test_create_env_overrides_template_env(built):
    name, _ = built
    sbx = Sandbox.create(name, envs={"GREETING": "from create"})
    try:
        assert sbx.commands.run("echo $GREETING").stdout.strip() == "from create"
    finally:
        sbx.kill()


def test_template_api_reports_the_built_template(siesta, built):
    name, _ = built
    assert Template.exists(name)
    assert not Template.exists(_name("never-built"))
    with _api(siesta) as api:
        got = api.get(f"/templates/{name}")
        assert got.status_code == 200, got.text
        assert got.json()["templateID"] == name
        assert got.json()["builds"], got.json()
        listed = [t["templateID"] for t in api.get("/templates").json()]
        assert name in listed


def test_unchanged_build_is_cached(built):
    name, _ = built
    again = Template().from_template(name).run_cmd("true")
    other = _name("cached")
    Template.build(again, other)
    logs = []
    Template.build(again, other, on_build_logs=logs.append)
    assert any("cached" in e.message for e in logs), [e.message for e in logs]


def test_failing_step_names_its_exit_code_and_output(siesta):
    template = (
        Template()
        .from_template("base")
        .run_cmd("echo before-the-failure && exit 7")
    )
    with pytest.raises(BuildException) as err:
        Template.build(template, _name("fails"))
    message = str(err.value)
    assert "exit code 7" in message, message
    assert "before-the-failure" in message, message


def test_missing_template_and_unreachable_registry_are_clear(siesta):
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_template("no-such-template"), _name("nosrc"))
    assert "no-such-template" in str(err.value)
    # Docker Hub is not reachable from these machines: the build says so.
    with pytest.raises(BuildException) as err:
        Template.build(Template().from_image("ubuntu:22.04"), _name("oci"))
    assert "docker.io/library/ubuntu:22.04" in str(err.value), str(err.value)
    assert "cannot be reached" in str(err.value), str(err.value)


def test_upload_links_are_signed(siesta):
    with _api(siesta) as api:
        created = api.post("/v3/templates", json={"name": _name("upload")})
        assert created.status_code == 202, created.text
        template_id = created.json()["templateID"]
        digest = uuid.uuid4().hex * 2
        link = api.get(f"/templates/{template_id}/files/{digest}")
        assert link.status_code == 201, link.text
        assert link.json()["present"] is False
        url = link.json()["url"]
    with httpx.Client(timeout=30) as plain:
        tampered = url.replace("signature=", "signature=00")
        assert plain.put(tampered, content=b"x").status_code == 403
        unsigned = url.split("?")[0]
        assert plain.put(unsigned, content=b"x").status_code == 403
        assert plain.put(url, content=b"archive bytes").status_code == 201
    with _api(siesta) as api:
        again = api.get(f"/templates/{template_id}/files/{digest}")
        assert again.json() == {"present": True}


def test_dockerfile_build_from_the_cli(siesta, tmp_path):
    """`siesta template build NAME -f Dockerfile CONTEXT` on the server's
    home, then a sandbox of it through the SDK."""
    import subprocess

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "app.py").write_text("print('hi from app')\n")
    (tmp_path / "Dockerfile").write_text(
        "FROM base\n"
        "ARG GREETING=hello\n"
        "ENV APP_HOME=/srv/app\n"
        "WORKDIR /srv/app\n"
        "COPY --chown=user:user src/ ./\n"
        'RUN echo "$GREETING" > greeting.txt && python3 app.py\n'
        "USER user\n"
        'CMD ["python3", "-m", "http.server", "8123"]\n'
    )
    name = _name("dockerfile")
    env = dict(os.environ, SIESTA_HOME=str(siesta.home))
    cmd = [str(siesta.binary), "template", "build", name, "-f", str(tmp_path / "Dockerfile"),
           "--build-arg", "GREETING=from-cli", "--ready-cmd", "curl -sf localhost:8123 >/dev/null"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hi from app" in done.stdout, done.stdout
    try:
        sbx = Sandbox.create(name)
        try:
            run = sbx.commands.run
            assert run("cat /srv/app/greeting.txt").stdout.strip() == "from-cli"
            assert run("stat -c %U /srv/app/app.py").stdout.strip() == "user"
            assert run("pwd").stdout.strip() == "/srv/app"
            assert run("whoami").stdout.strip() == "user"
            assert run("echo $APP_HOME").stdout.strip() == "/srv/app"
            assert run("curl -s -o /dev/null -w '%{http_code}' localhost:8123").stdout == "200"
        finally:
            sbx.kill()
    finally:
        subprocess.run([str(siesta.binary), "template", "delete", name], env=env, check=False)

    bad = tmp_path / "Bad"
    bad.write_text("FROM base\nRUN true\nVOLUME /data\n")
    done = subprocess.run([str(siesta.binary), "template", "build", "bad", "-f", str(bad)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "line 3: VOLUME is not supported" in done.stderr, done.stderr


def test_tags_assign_list_and_remove(built):
    name, _ = built
    info = Template.assign_tags(name, ["production", "latest"])
    assert info.build_id and set(info.tags) == {"production", "latest"}
    tags = {t.tag: t for t in Template.get_tags(name)}
    assert {"production", "latest"} <= set(tags), tags
    assert tags["production"].build_id == info.build_id
    Template.remove_tags(name, "production")
    assert "production" not in {t.tag for t in Template.get_tags(name)}
    with pytest.raises(Exception):
        Template.assign_tags(name, ":no-name")
    # name:tag creates from the template of that name.
    sbx = Sandbox.create(f"{name}:latest")
    try:
        assert sbx.commands.run("cat /etc/siesta-built").stdout.strip() == "built"
    finally:
        sbx.kill()


def _layered(last: str, skip_cache_at_second: bool = False):
    """Four steps; the stamps say whether a step ran again. The first also
    writes into /tmp, which a cached rebuild must keep as a fresh build
    does (the step cache keeps the disk: /tmp is on it, as in E2B)."""
    t = (
        Template()
        .from_template("base")
        .run_cmd("date +%s%N > /opt/first && whoami > /tmp/run-user", user="root")
        .set_envs({"LAYER": "one"})
    )
    if skip_cache_at_second:
        t = t.skip_cache()
    return t.run_cmd("date +%s%N > /opt/second", user="root").run_cmd(
        f"echo {last} > /opt/last", user="root"
    )


def _stamps(name: str) -> list[str]:
    sbx = Sandbox.create(name)
    try:
        out = sbx.commands.run("cat /opt/first /opt/second /opt/last /tmp/run-user; echo $LAYER")
        return out.stdout.split()
    finally:
        sbx.kill()


def test_a_changed_step_reuses_the_steps_before_it(siesta):
    """Per-step caching: changing the last step runs only that step, on
    the disk the cached steps left; `skip_cache()` runs from where it is."""
    name = _name("layers")
    try:
        Template.build(_layered("a"), name)
        first, second, last, run_user, env = _stamps(name)
        assert (last, run_user, env) == ("a", "root", "one")

        logs = []
        Template.build(_layered("b"), name, on_build_logs=logs.append)
        messages = [e.message for e in logs]
        assert any("steps 1-3 of 4: cached" in m for m in messages), messages
        assert not any("[1/4]" in m or "[3/4]" in m for m in messages), messages
        assert any("[4/4]" in m for m in messages), messages
        assert _stamps(name) == [first, second, "b", "root", "one"]

        logs = []
        Template.build(_layered("b", skip_cache_at_second=True), name, on_build_logs=logs.append)
        messages = [e.message for e in logs]
        assert any("steps 1-2 of 4: cached" in m for m in messages), messages
        again = _stamps(name)
        assert again[0] == first and again[1] != second, (again, first, second)
        assert again[2:] == ["b", "root", "one"]
    finally:
        with _api(siesta) as api:
            api.delete(f"/templates/{name}")
