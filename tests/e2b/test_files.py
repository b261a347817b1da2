"""Files through the envd front door: /files uploads and downloads and the
filesystem.Filesystem RPCs."""

import time

import pytest
from e2b import FileNotFoundException, FileType, FilesystemEventType
from e2b.sandbox.filesystem.filesystem import WriteEntry

HOME = "/home/user"


def test_write_read(sbx):
    info = sbx.files.write(f"{HOME}/state.txt", "persist-me")
    assert info.path == f"{HOME}/state.txt"
    assert sbx.files.read(f"{HOME}/state.txt") == "persist-me"
    assert sbx.commands.run(f"cat {HOME}/state.txt").stdout == "persist-me"


def test_binary_roundtrip_and_large_file(sbx):
    data = bytes(range(256)) * 8192  # 2 MiB
    sbx.files.write(f"{HOME}/blob.bin", data)
    assert sbx.files.read(f"{HOME}/blob.bin", format="bytes") == data


def test_write_files_multiple(sbx):
    infos = sbx.files.write_files(
        [
            WriteEntry(path=f"{HOME}/multi/a.txt", data="A"),
            WriteEntry(path=f"{HOME}/multi/deep/b.txt", data=b"B"),
        ]
    )
    assert sorted(i.path for i in infos) == [f"{HOME}/multi/a.txt", f"{HOME}/multi/deep/b.txt"]
    assert sbx.files.read(f"{HOME}/multi/deep/b.txt") == "B"


def test_list_exists_get_info(sbx):
    sbx.files.write(f"{HOME}/listme/one.txt", "1")
    sbx.files.make_dir(f"{HOME}/listme/sub")
    entries = {e.name: e for e in sbx.files.list(f"{HOME}/listme")}
    assert set(entries) == {"one.txt", "sub"}
    assert entries["one.txt"].type == FileType.FILE
    assert entries["sub"].type == FileType.DIR
    assert sbx.files.exists(f"{HOME}/listme/one.txt") is True
    assert sbx.files.exists(f"{HOME}/listme/nope") is False
    info = sbx.files.get_info(f"{HOME}/listme/one.txt")
    assert info.size == 1 and info.type == FileType.FILE
    with pytest.raises(FileNotFoundException):
        sbx.files.get_info(f"{HOME}/listme/nope")


def test_make_dir_true_then_false(sbx):
    assert sbx.files.make_dir(f"{HOME}/newdir/nested") is True
    assert sbx.files.make_dir(f"{HOME}/newdir/nested") is False


def test_rename_and_remove(sbx):
    sbx.files.write(f"{HOME}/old.txt", "x")
    entry = sbx.files.rename(f"{HOME}/old.txt", f"{HOME}/new.txt")
    assert entry.path == f"{HOME}/new.txt"
    assert sbx.files.exists(f"{HOME}/old.txt") is False
    sbx.files.remove(f"{HOME}/new.txt")
    assert sbx.files.exists(f"{HOME}/new.txt") is False


def test_read_missing_file(sbx):
    with pytest.raises(FileNotFoundException):
        sbx.files.read(f"{HOME}/does-not-exist")


def test_watch_dir_sees_a_create(sbx):
    sbx.files.make_dir(f"{HOME}/watched")
    handle = sbx.files.watch_dir(f"{HOME}/watched")
    try:
        sbx.files.write(f"{HOME}/watched/new.txt", "hello")
        events = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            events += handle.get_new_events()
            if any(e.name == "new.txt" and e.type == FilesystemEventType.CREATE for e in events):
                break
            time.sleep(0.2)
        assert any(
            e.name == "new.txt" and e.type == FilesystemEventType.CREATE for e in events
        ), events
    finally:
        handle.stop()


def test_signed_urls_of_a_secure_sandbox_need_no_header(siesta):
    """download_url/upload_url name no sandbox; the front door finds it by
    the signature, and the agent checks the signature and its expiry."""
    import httpx
    from e2b import Sandbox

    box = Sandbox.create(template="base", secure=True, timeout=120)
    try:
        box.files.write(f"{HOME}/signed.txt", "signed content")
        with httpx.Client(timeout=30) as plain:  # no headers, as curl would
            got = plain.get(box.download_url(f"{HOME}/signed.txt", "user"))
            assert got.status_code == 200, got.text
            assert got.text == "signed content"
            got = plain.get(box.download_url(f"{HOME}/signed.txt", "user", 120))
            assert got.text == "signed content"
            expired = plain.get(box.download_url(f"{HOME}/signed.txt", "user", -120))
            assert expired.status_code == 401
            assert expired.json() == {"code": 401, "message": "signature is already expired"}
            # Signed for another path: no sandbox matches, nothing is served.
            url = box.download_url(f"{HOME}/signed.txt", "user").replace("signed.txt", "other.txt")
            assert plain.get(url).status_code == 404
            up = plain.post(box.upload_url(f"{HOME}/uploaded.txt", "user"),
                            files={"file": ("uploaded.txt", b"via upload url")})
            assert up.status_code == 200, up.text
        assert box.files.read(f"{HOME}/uploaded.txt") == "via upload url"
    finally:
        box.kill()
