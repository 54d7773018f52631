"""Path safety: a manifest can never make a node write outside its data directory.

Where bytes land: ``swarm fetch --no-daemon`` writes DEST and its siblings
(``.DEST.swarm-part``, ``.state``, ``.state.tmp``) through ``PieceFile``; the daemon
gives libtorrent ``$SWARM_HOME/data/<info_hash>/`` as its save path, and libtorrent saves
the file under the torrent's own name (``name.utf-8`` first, then ``name``). So every
name in a manifest and in its torrent must be one safe path component, and the torrent
must not describe anything but one plain file (no BEP 47 symlink, no file list). The
refusal is a ``ManifestError``: exit code 5, "integrity failure", before any file exists.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fastbencode
import pytest

from swarm.agent.daemon import Daemon
from swarm.agent.store import PieceFile
from swarm.errors import IntegrityError, ManifestError
from swarm.manifest import MAX_NAME_LEN, NAME_MAX, Manifest, check_name
from swarm.pieces import KiB
from swarm.sources.peers import strip_web_seeds

PIECE = 16 * KiB
DATA = random.Random(5).randbytes(3 * PIECE + 7)

GOOD_NAMES = [
    "index.db",
    "model-v1.2.bin",
    "build_2026.tar.gz",
    "a",
    "A+B@c=d.bin",
    "_private.bin",
    "x" * MAX_NAME_LEN,
]
BAD_NAMES = [
    "",
    ".",
    "..",
    "...",
    "../../etc/passwd",
    "/etc/passwd",
    "a/b",
    "..\\..\\x",
    "-rf",
    "--help",
    ".bashrc",
    "a\x00b",
    "index.db\n",
    "a\tb",
    "a\x1b[2Jb",
    "a\x7fb",
    "a b",
    "\u00e9t\u00e9.bin",
    "x" * (MAX_NAME_LEN + 1),
]


def _info(name: Any = b"index.db", changes: dict[bytes, Any] | None = None) -> dict[bytes, Any]:
    """A valid single-file info dict for ``DATA``, with ``changes`` applied (a value of
    ``None`` deletes the key)."""
    pieces = b"".join(
        hashlib.sha1(DATA[offset : offset + PIECE]).digest()
        for offset in range(0, len(DATA), PIECE)
    )
    info: dict[bytes, Any] = {
        b"name": name,
        b"length": len(DATA),
        b"piece length": PIECE,
        b"pieces": pieces,
        b"private": 1,
    }
    for key, value in (changes or {}).items():
        if value is None:
            info.pop(key, None)
        else:
            info[key] = value
    return info


def _manifest_bytes(name: str, info: dict[bytes, Any]) -> bytes:
    """A manifest whose own fields (size, sha256, info_hash) agree with ``info``: only what
    the case is about is wrong with it."""
    torrent = fastbencode.bencode({b"info": info, b"created by": b"swarm"})
    manifest = Manifest(
        name, len(DATA), hashlib.sha256(DATA).hexdigest(), PIECE, "bucket", "k", torrent
    )
    return manifest.dumps()


# -- names --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_real_artifact_names_are_accepted(name: str, tmp_path: Path) -> None:
    assert check_name(name) == name
    manifest = Manifest.loads(_manifest_bytes(name, _info(name.encode())))
    assert manifest.name == name
    # The daemon's save path, and the file libtorrent names inside it.
    save_dir = tmp_path / "home" / "data" / manifest.info_hash
    assert (save_dir / manifest.name).resolve().parent == save_dir.resolve()
    assert strip_web_seeds(manifest.torrent).name() == name


@pytest.mark.parametrize("name", BAD_NAMES)
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(ManifestError, match="unsafe artifact name"):
        check_name(name)


@pytest.mark.parametrize("name", BAD_NAMES)
def test_manifest_with_unsafe_name_is_refused_exit_5(name: str) -> None:
    # Manifest and torrent agree on the bad name: only the name check stands in the way.
    data = _manifest_bytes(name, _info(name.encode("utf-8", "surrogateescape")))
    with pytest.raises(ManifestError) as refused:
        Manifest.loads(data)
    assert refused.value.exit_code == IntegrityError.exit_code == 5


def test_name_limit_leaves_room_for_every_derived_file() -> None:
    longest = f".{'x' * MAX_NAME_LEN}.swarm-part.state.tmp"
    assert len(longest) == NAME_MAX


# -- the torrent inside the manifest --------------------------------------------------------

MALICIOUS_TORRENTS: dict[str, tuple[dict[bytes, Any], str]] = {
    "torrent-name-traversal": (_info(b"../index.db"), "name differ"),
    "torrent-name-absolute": (_info(b"/etc/passwd"), "name differ"),
    "torrent-name-not-utf8": (_info(b"index\xff.db"), "utf-8"),
    "torrent-name-not-a-string": (_info(5), "expected bytes"),
    "name.utf-8-traversal": (
        _info(changes={b"name.utf-8": b"../../etc/passwd"}),
        "name.utf-8 differs",
    ),
    "name.utf-8-other-file": (_info(changes={b"name.utf-8": b"other.db"}), "name.utf-8 differs"),
    "name.utf-8-not-a-string": (
        _info(changes={b"name.utf-8": [b"index.db"]}),
        "name.utf-8 differs",
    ),
    "bep47-symlink": (
        _info(changes={b"attr": b"l", b"symlink path": [b"..", b"..", b"etc", b"passwd"]}),
        "symlink",
    ),
    "bep47-attr-l-only": (_info(changes={b"attr": b"xl"}), "symlink"),
    "bep47-symlink-path-only": (_info(changes={b"symlink path": [b"etc", b"passwd"]}), "symlink"),
    "bep47-padding-file": (_info(changes={b"attr": b"p"}), "padding file"),
    "bep47-attr-not-a-string": (_info(changes={b"attr": [b"l"]}), "attr is not a string"),
    # Both keep "length", so the refusal is the file list's, not a missing field's.
    "multi-file": (
        _info(changes={b"files": [{b"length": 1, b"path": [b"..", b"..", b"x"]}]}),
        "multi-file",
    ),
    "bep52-file-tree": (
        _info(
            changes={
                b"file tree": {b"..": {b"x": {b"": {b"length": 1, b"pieces root": b"\0" * 32}}}}
            }
        ),
        "multi-file",
    ),
}


@pytest.mark.parametrize(
    ("info", "reason"), MALICIOUS_TORRENTS.values(), ids=MALICIOUS_TORRENTS.keys()
)
def test_malicious_torrent_is_refused_exit_5(info: dict[bytes, Any], reason: str) -> None:
    with pytest.raises(ManifestError, match="inconsistent") as refused:
        Manifest.loads(_manifest_bytes("index.db", info))
    assert reason in str(refused.value)
    assert refused.value.exit_code == 5


@pytest.mark.parametrize(
    "info",
    [
        _info(changes={b"name.utf-8": b"index.db"}),
        _info(changes={b"attr": b"x"}),
        _info(changes={b"attr": b""}),
    ],
    ids=["name.utf-8-same", "bep47-executable", "bep47-empty"],
)
def test_harmless_torrent_keys_are_accepted(info: dict[bytes, Any]) -> None:
    manifest = Manifest.loads(_manifest_bytes("index.db", info))
    assert strip_web_seeds(manifest.torrent).name() == "index.db"


def test_libtorrent_saves_under_name_utf8_which_is_why_it_must_match() -> None:
    """The precedent for refusing a differing ``name.utf-8``: libtorrent saves under it."""
    info = _info(changes={b"name.utf-8": b"elsewhere.db"})
    assert strip_web_seeds(fastbencode.bencode({b"info": info})).name() == "elsewhere.db"


# -- nothing is written outside the data directory -------------------------------------------


def _tree(root: Path) -> set[Path]:
    return {path for path in root.rglob("*")}


@pytest.mark.parametrize("name", ["model-v1.2.bin", "x" * MAX_NAME_LEN])
def test_piece_file_writes_only_dest_and_its_siblings(name: str, tmp_path: Path) -> None:
    source = tmp_path / "source" / name
    source.parent.mkdir()
    source.write_bytes(DATA)
    manifest = Manifest.from_file(
        source, name=name, piece_size=PIECE, bucket="b", key="k", web_seed=None
    )
    dest_dir = tmp_path / "dest"
    dest_dir.mkdir()
    before = _tree(tmp_path)
    sink = PieceFile(manifest, dest_dir / name)
    sink.open()
    whole_file = sink.start_prefix_hasher()
    try:
        for index in range(manifest.layout.count):
            offset = manifest.layout.offset(index)
            assert sink.offer(index, DATA[offset : offset + PIECE], "s3")
        # The partial file and its state file (the longest derived names) exist now.
        assert {p.name for p in dest_dir.iterdir()} == {
            f".{name}.swarm-part",
            f".{name}.swarm-part.state",
        }
        sink.finalize(whole_file)
    finally:
        sink.close()
    created = _tree(tmp_path) - before
    assert created == {dest_dir / name}
    assert (dest_dir / name).read_bytes() == DATA


def test_daemon_restore_refuses_unsafe_manifests_before_adding(tmp_path: Path) -> None:
    """The daemon adds what ``Manifest.loads`` accepted (a restart reads
    ``home/artifacts/*.swarm``; a fetch loads from S3 the same way), and ``_add`` saves to
    ``home/data/<info_hash>/<name>``. An unsafe manifest must stop before ``_add``."""
    home = tmp_path / "home"
    (home / "artifacts").mkdir(parents=True)
    planted = {
        "good": _manifest_bytes("index.db", _info()),
        "traversal": _manifest_bytes("../../escape", _info(b"../../escape")),
        "symlink": _manifest_bytes(
            "index.db", _info(changes={b"attr": b"l", b"symlink path": [b"x"]})
        ),
        "name-utf8": _manifest_bytes("index.db", _info(changes={b"name.utf-8": b"../../escape"})),
    }
    for label, data in planted.items():
        (home / "artifacts" / f"{label}.swarm").write_bytes(data)
    good = Manifest.loads(planted["good"])
    held = home / "data" / good.info_hash / good.name  # restore skips what has no data
    held.parent.mkdir(parents=True)
    held.write_bytes(DATA)
    added: list[Manifest] = []

    def add(manifest: Manifest, data_path: Path, *_: object, **__: object) -> SimpleNamespace:
        assert data_path == held
        added.append(manifest)
        return SimpleNamespace()

    # restore() without a libtorrent session: only its loading and refusing is under test.
    fake = SimpleNamespace(
        home=home,
        _add=add,
        completion=SimpleNamespace(start=lambda _artifact: None),
        session=SimpleNamespace(remove=lambda _info_hash: None),
    )
    Daemon.restore(fake)  # type: ignore[arg-type]

    assert [m.name for m in added] == ["index.db"]
    data_dir = (home / "data").resolve()
    for manifest in added:
        target = (home / "data" / manifest.info_hash / manifest.name).resolve()
        assert target.is_relative_to(data_dir / manifest.info_hash)
        assert fastbencode.bdecode(manifest.torrent)[b"info"][b"name"] == b"index.db"
