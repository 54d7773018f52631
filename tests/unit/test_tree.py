"""Directory artifacts, pure parts: the logical byte space -> file spans, the path and
file-list rules, and the manifest's checks of both (its list and its metainfo)."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import fastbencode
import pytest

from swarm.errors import ManifestError, UsageError
from swarm.manifest import Manifest
from swarm.tree import FileEntry, Span, TreeLayout, check_files, check_path, scan_dir

SHA = "0" * 64


def test_spans_split_a_range_across_files_and_skip_empty_ones():
    layout = TreeLayout([10, 0, 5, 0, 0, 20])  # files at [0,10) [10,10) [10,15) ... [15,35)
    assert layout.total == 35
    assert layout.spans(8, 17) == [Span(0, 8, 2, 8), Span(2, 0, 5, 10), Span(5, 0, 2, 15)]
    assert layout.spans(10, 15) == [Span(2, 0, 5, 10)]  # starts at the empty file's offset
    assert layout.spans(0, 35) == [Span(0, 0, 10, 0), Span(2, 0, 5, 10), Span(5, 0, 20, 15)]
    assert layout.spans(34, 35) == [Span(5, 19, 1, 34)]
    assert layout.spans(7, 7) == []
    with pytest.raises(ValueError):
        layout.spans(30, 36)


def test_spans_cover_every_byte_once_for_any_piece_size():
    sizes = [3, 0, 17, 1, 0, 64, 5]
    layout = TreeLayout(sizes)
    for piece in (1, 4, 16, 100):
        covered = []
        for start in range(0, layout.total, piece):
            for span in layout.spans(start, min(start + piece, layout.total)):
                assert span.offset >= 0 and span.offset + span.length <= sizes[span.file]
                covered += [(span.file, span.offset + i) for i in range(span.length)]
        assert covered == [(f, o) for f, size in enumerate(sizes) for o in range(size)]


@pytest.mark.parametrize(
    "path",
    ["../x", "a/../../x", "/etc/passwd", "a//b", "a/./b", ".", "", "a/", "a\\b", "a\nb", "x" * 256],
)
def test_unsafe_paths_are_refused(path):
    with pytest.raises(ManifestError, match="unsafe file path"):
        check_path(path)


@pytest.mark.parametrize("path", [".gitattributes", "a/b c/d.bin", "weights/-x", "ü/ñ"])
def test_ordinary_paths_pass(path):
    assert check_path(path) == path


def test_file_list_rules():
    check_files([FileEntry("a/b", 1, SHA), FileEntry("a-b", 0, SHA)])  # component order
    for files, why in (
        ([FileEntry("a", 1, SHA), FileEntry("a", 1, SHA)], "duplicate"),
        ([FileEntry("b", 1, SHA), FileEntry("a", 1, SHA)], "out of order"),
        ([FileEntry("a", 1, SHA), FileEntry("a/b", 1, SHA)], "both a file and a directory"),
        ([FileEntry("a", -1, SHA)], "bad size"),
        ([FileEntry("a", 1, "xyz")], "sha256"),
        ([], "empty"),
    ):
        with pytest.raises(ManifestError, match=why):
            check_files(files)


def make_tree(root: Path) -> dict[str, bytes]:
    files = {"z.bin": b"z" * 70_000, "a/b/c.bin": bytes(range(256)) * 300, "a/empty": b""}
    files["a-b"] = b"after a/ in component order"
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def test_manifest_of_a_tree_hashes_the_concatenation_in_tree_order(tmp_path):
    files = make_tree(tmp_path)
    manifest = Manifest.from_tree(
        scan_dir(tmp_path), name="m", piece_size=16384, bucket="b", prefix="p/"
    )
    assert manifest.files is not None
    order = [e.path for e in manifest.files]
    assert order == ["a/b/c.bin", "a/empty", "a-b", "z.bin"]
    blob = b"".join(files[p] for p in order)
    assert manifest.size == len(blob) and manifest.sha256 == hashlib.sha256(blob).hexdigest()
    expect = [hashlib.sha1(blob[i : i + 16384]).digest() for i in range(0, len(blob), 16384)]
    assert manifest.piece_hashes == expect
    assert [e.sha256 for e in manifest.files] == [
        hashlib.sha256(files[p]).hexdigest() for p in order
    ]
    again = Manifest.loads(manifest.dumps("s3cret-s3cret-s3cret"), "s3cret-s3cret-s3cret")
    assert again == manifest and again.info_hash == manifest.info_hash


def forge(manifest: Manifest, *, path: str | None = None, torrent_path=None, attr=None) -> bytes:
    body = json.loads(manifest.dumps())
    meta = fastbencode.bdecode(manifest.torrent)
    if path is not None:
        body["files"][0]["path"] = path
    if torrent_path is not None:
        meta[b"info"][b"files"][0][b"path"] = torrent_path
    if attr is not None:
        meta[b"info"][b"files"][0][b"attr"] = attr
    body["torrent"] = base64.b64encode(fastbencode.bencode(meta)).decode()
    body.pop("info_hash")
    return json.dumps(body).encode()


def test_manifest_refuses_unsafe_or_inconsistent_file_lists(tmp_path):
    make_tree(tmp_path)
    good = Manifest.from_tree(
        scan_dir(tmp_path), name="m", piece_size=16384, bucket="b", prefix="p/"
    )
    cases = {
        "traversal in both": forge(good, path="../c.bin", torrent_path=[b"..", b"c.bin"]),
        "absolute in both": forge(good, path="/c.bin", torrent_path=[b"", b"c.bin"]),
        "metainfo path differs": forge(good, torrent_path=[b"..", b"a", b"b", b"c.bin"]),
        "slash inside a metainfo component": forge(good, torrent_path=[b"a/b", b"c.bin"]),
        "symlink attr": forge(good, attr=b"l"),
    }
    for _why, data in cases.items():
        with pytest.raises(ManifestError, match=r"unsafe file path|metainfo files"):
            Manifest.loads(data)
    body = json.loads(good.dumps())
    body["files"].append(dict(body["files"][0]))  # a duplicate
    with pytest.raises(ManifestError, match=r"duplicate|order"):
        Manifest.loads(json.dumps(body).encode())
    body = json.loads(good.dumps())
    del body["files"]  # a multi-file metainfo with no file list: refused as before
    with pytest.raises(ManifestError, match="inconsistent"):
        Manifest.loads(json.dumps(body).encode())


def test_scan_dir_refuses_symlinks_and_empty_trees(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(UsageError, match="no file"):
        scan_dir(tmp_path)
    (tmp_path / "d" / "f").write_bytes(b"x")
    (tmp_path / "d" / "link").symlink_to("f")
    with pytest.raises(UsageError, match="symlink"):
        scan_dir(tmp_path)
