"""The artifact manifest: BitTorrent metainfo + size + SHA-256 + S3 location.

Stored as JSON at ``s3://BUCKET/KEY.swarm`` next to the object. The torrent's info dict
is the single source of piece hashes, so any BitTorrent client given ``KEY.torrent``
(the same metainfo, written alongside) joins the same swarm with the same info-hash.

Integrity of the manifest itself: a loader checks that every field agrees with the
metainfo (size, piece size, piece count, name). When the fleet has a secret
(``SWARM_SECRET``), publish signs the manifest with HMAC-SHA256 and a fetch refuses a
manifest whose signature is missing or wrong, so a writer to the bucket who lacks the
secret cannot swap the piece hashes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastbencode

from swarm.errors import ManifestError
from swarm.pieces import PieceLayout, sha1_pieces, validate_piece_size
from swarm.tree import FileEntry, TreeLayout, check_files, tree_order

MANIFEST_VERSION = 1
MANIFEST_SUFFIX = ".swarm"
TORRENT_SUFFIX = ".torrent"
HASH_CHUNK = 1 << 20
NAME_MAX = 255
"""Longest file name most Linux file systems take (ext4, xfs: 255 bytes)."""

LONGEST_SIBLING = ".{}.swarm-part.state.tmp"
"""The longest file name a fetch derives from an artifact name (``swarm.agent.store``'s
partial file, its state file and that file's temporary copy)."""

MAX_NAME_LEN = NAME_MAX - len(LONGEST_SIBLING.format(""))
"""Longest artifact name (233): every file derived from it still fits in ``NAME_MAX``."""

SAFE_NAME = re.compile(rf"[A-Za-z0-9_+][A-Za-z0-9._+@=-]{{0,{MAX_NAME_LEN - 1}}}")
"""One path component of printable ASCII, matched with ``fullmatch`` (``$`` would accept a
trailing newline). No leading ``-`` (it reads as an option to any tool handed the name)
and no leading ``.`` (hidden files, ``.`` and ``..``, and our own ``.NAME.swarm-part``)."""


def check_name(name: str) -> str:
    """An artifact name is one path component: no separators, no traversal, no hidden dot-dot.

    Raises:
        ManifestError: ``name`` could escape a directory, hide, or read as an option.
    """
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name):
        raise ManifestError(
            f"swarm: unsafe artifact name {name!r}: use 1..{MAX_NAME_LEN} letters, digits and "
            ". _ + - @ =, starting with a letter, digit, _ or + (one path component, no '/', "
            "no '..')"
        )
    return name


@dataclass(frozen=True)
class Manifest:
    """Everything a node needs to fetch and verify one artifact."""

    name: str
    size: int
    sha256: str
    piece_size: int
    bucket: str
    key: str
    torrent: bytes = field(repr=False)
    """Bencoded BitTorrent v1 metainfo (BEP 3), with the S3 object as ``url-list`` (BEP 19)."""
    files: tuple[FileEntry, ...] | None = None
    """A directory artifact's files in tree order (None: a single file). ``key`` is then
    the S3 prefix (ending in '/'), each file at ``key + path``; ``size`` and ``sha256``
    are those of the files concatenated in order (the logical byte space)."""

    @property
    def is_tree(self) -> bool:
        return self.files is not None

    @property
    def tree_layout(self) -> TreeLayout:
        assert self.files is not None
        return TreeLayout(entry.size for entry in self.files)

    @property
    def layout(self) -> PieceLayout:
        return PieceLayout(self.size, self.piece_size)

    @property
    def info(self) -> dict[bytes, Any]:
        return fastbencode.bdecode(self.torrent)[b"info"]

    @property
    def piece_hashes(self) -> list[bytes]:
        blob = self.info[b"pieces"]
        return [blob[i : i + 20] for i in range(0, len(blob), 20)]

    @property
    def info_hash(self) -> str:
        """Hex SHA-1 of the bencoded info dict: the torrent's identity on the wire."""
        return hashlib.sha1(fastbencode.bencode(self.info)).hexdigest()

    @property
    def s3_url(self) -> str:
        return f"s3://{self.bucket}/{self.key}"

    # -- building ---------------------------------------------------------------------------

    @classmethod
    def from_file(
        cls,
        path: Path,
        *,
        name: str,
        piece_size: int,
        bucket: str,
        key: str,
        web_seed: str | None,
    ) -> Manifest:
        """Hash ``path`` once: SHA-1 per piece for the metainfo, SHA-256 for the whole file."""
        validate_piece_size(piece_size)
        check_name(name)
        whole = hashlib.sha256()
        pieces = bytearray()
        size = 0
        with path.open("rb", buffering=0) as stream:
            for chunk, digest in sha1_pieces(stream, piece_size):
                whole.update(chunk)
                pieces += digest
                size += len(chunk)
        info = {
            b"name": name.encode(),
            b"length": size,
            b"piece length": piece_size,
            b"pieces": bytes(pieces),
            # A private torrent (BEP 27): peers come only from the fleet's tracker; no DHT/PEX.
            b"private": 1,
        }
        meta: dict[bytes, Any] = {b"info": info, b"created by": b"swarm"}
        if web_seed:
            meta[b"url-list"] = [web_seed.encode()]
        return cls(
            name, size, whole.hexdigest(), piece_size, bucket, key, fastbencode.bencode(meta)
        )

    @classmethod
    def from_tree(
        cls,
        files: list[tuple[str, Path, int]],
        *,
        name: str,
        piece_size: int,
        bucket: str,
        prefix: str,
        web_seed: str | None = None,
    ) -> Manifest:
        """Hash a directory's files (``swarm.tree.scan_dir``) once, in tree order: SHA-1
        per piece across file boundaries, SHA-256 per file and of the concatenation."""
        validate_piece_size(piece_size)
        check_name(name)
        files = sorted(files, key=lambda item: tree_order(item[0]))
        whole = hashlib.sha256()
        pieces = bytearray()
        piece = hashlib.sha1()
        in_piece = 0
        entries: list[FileEntry] = []
        for rel, path, _size in files:
            own = hashlib.sha256()
            size = 0
            with path.open("rb", buffering=0) as stream:
                while chunk := stream.read(HASH_CHUNK):
                    own.update(chunk)
                    whole.update(chunk)
                    size += len(chunk)
                    view = memoryview(chunk)
                    while view:
                        take = min(len(view), piece_size - in_piece)
                        piece.update(view[:take])
                        in_piece += take
                        view = view[take:]
                        if in_piece == piece_size:
                            pieces += piece.digest()
                            piece, in_piece = hashlib.sha1(), 0
            entries.append(FileEntry(rel, size, own.hexdigest()))
        if in_piece:
            pieces += piece.digest()
        check_files(entries)
        info = {
            b"name": name.encode(),
            b"files": [
                {b"length": e.size, b"path": [p.encode() for p in e.parts]} for e in entries
            ],
            b"piece length": piece_size,
            b"pieces": bytes(pieces),
            b"private": 1,
        }
        meta: dict[bytes, Any] = {b"info": info, b"created by": b"swarm"}
        if web_seed:  # BEP 19 multi-file: the url names the directory, ending in '/'
            meta[b"url-list"] = [web_seed.encode()]
        total = sum(e.size for e in entries)
        return cls(
            name,
            total,
            whole.hexdigest(),
            piece_size,
            bucket,
            prefix,
            fastbencode.bencode(meta),
            tuple(entries),
        )

    # -- serialisation ----------------------------------------------------------------------

    def _body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "version": MANIFEST_VERSION,
            "name": self.name,
            "size": self.size,
            "sha256": self.sha256,
            "piece_size": self.piece_size,
            "s3": {"bucket": self.bucket, "key": self.key},
            "info_hash": self.info_hash,
            "torrent": base64.b64encode(self.torrent).decode(),
        }
        if self.files is not None:  # absent for single files: their manifests are unchanged
            body["files"] = [
                {"path": e.path, "size": e.size, "sha256": e.sha256} for e in self.files
            ]
        return body

    def dumps(self, secret: str | None = None) -> bytes:
        body = self._body()
        if secret:
            body["signature"] = _sign(body, secret)
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def loads(cls, data: bytes, secret: str | None = None, origin: str = "manifest") -> Manifest:
        """Parse and check a manifest; raise :class:`ManifestError` on anything inconsistent."""
        try:
            body = json.loads(data)
            if not isinstance(body, dict):
                raise TypeError("not a JSON object")
            version = body["version"]
            if version != MANIFEST_VERSION:
                raise ManifestError(
                    f"swarm: manifest {origin} has version {version!r}; this swarm reads version "
                    f"{MANIFEST_VERSION}: upgrade swarm or republish the artifact"
                )
            manifest = cls(
                name=_typed(body["name"], str),
                size=_typed(body["size"], int),
                sha256=_typed(body["sha256"], str),
                piece_size=_typed(body["piece_size"], int),
                bucket=_typed(body["s3"]["bucket"], str),
                key=_typed(body["s3"]["key"], str),
                torrent=base64.b64decode(_typed(body["torrent"], str), validate=True),
                files=_files(body.get("files")),
            )
            signature = body.get("signature")
        except ManifestError:
            raise
        # RecursionError: json.loads of deeply nested arrays (found by tests/fuzz).
        except (ValueError, KeyError, TypeError, RecursionError) as error:
            raise ManifestError(
                f"swarm: {origin} is not a valid swarm manifest ({error}): republish it with "
                "`swarm publish`"
            ) from error
        manifest._check(origin, body.get("info_hash"))
        if secret and (
            not isinstance(signature, str)
            # compare_digest raises TypeError on non-ASCII str (found by tests/fuzz).
            or not signature.isascii()
            or not hmac.compare_digest(signature, _sign(manifest._body(), secret))
        ):
            raise ManifestError(
                f"swarm: manifest {origin} signature is missing or wrong for this SWARM_SECRET: "
                "the manifest was tampered with or published with another secret"
            )
        return manifest

    def _check(self, origin: str, info_hash: object) -> None:
        def bad(why: str) -> ManifestError:
            return ManifestError(
                f"swarm: manifest {origin} is inconsistent ({why}); refusing it: republish "
                "the artifact with `swarm publish`"
            )

        check_name(self.name)
        if not re.fullmatch(r"[0-9a-f]{64}", self.sha256):
            raise bad("sha256 is not 64 hex digits")
        if self.size < 0:
            raise bad("negative size")
        try:
            validate_piece_size(self.piece_size)
            meta = fastbencode.bdecode(self.torrent)
            if not isinstance(meta, dict) or not isinstance(meta.get(b"info"), dict):
                raise TypeError("no info dictionary")
            info = meta[b"info"]
            # Typed, so a list or an int where bytes belong is refused, not an AttributeError.
            length = _typed(info[b"length"], int) if self.files is None else 0
            plen = _typed(info[b"piece length"], int)
            pieces = _typed(info[b"pieces"], bytes)
            raw_name = _typed(info[b"name"], bytes)
            tname = raw_name.decode()
        except (ValueError, KeyError, TypeError) as error:  # UnicodeDecodeError is a ValueError
            raise bad(f"metainfo: {error}") from error
        # What a BitTorrent client writes is decided by the info dict, not by our manifest
        # fields, so everything in it that names a path or a file type must be refused here.
        if b"file tree" in info:
            # BEP 52 (v2/hybrid) file tree: paths we would not check.
            raise bad("multi-file v2 file trees are not artifacts")
        if (b"files" in info) != self.is_tree:
            raise bad("a multi-file metainfo needs the manifest's file list, and only it has one")
        if self.files is not None:
            _check_tree_info(info, self.files, bad)
            length = sum(e.size for e in self.files)
            if self.size == 0:
                raise bad("a directory artifact needs at least one byte")
            if not self.key.endswith("/"):
                raise bad("a directory artifact's S3 key is a prefix ending in '/'")
        if b"name.utf-8" in info and info[b"name.utf-8"] != raw_name:
            # libtorrent prefers name.utf-8 over name when saving, so it must not differ.
            raise bad("metainfo name.utf-8 differs from name")
        attr = info.get(b"attr", b"")
        if not isinstance(attr, bytes):
            raise bad("metainfo attr is not a string")
        if b"l" in attr or b"symlink path" in info:
            # BEP 47: a symlink would let the torrent write or expose files outside its dir.
            raise bad("the metainfo describes a symlink (BEP 47 attr 'l' or 'symlink path')")
        if b"p" in attr:
            raise bad("the metainfo describes a padding file (BEP 47 attr 'p')")
        if (length, plen, tname) != (self.size, self.piece_size, self.name):
            raise bad("metainfo length, piece length or name differ from the manifest")
        if len(pieces) != 20 * self.layout.count:
            raise bad(f"{len(pieces) // 20} piece hashes for {self.layout.count} pieces")
        if info_hash is not None and info_hash != self.info_hash:
            raise bad("info_hash does not match the metainfo")


def manifest_key(key: str) -> str:
    """Where an artifact's manifest is: ``KEY.swarm`` for a file; for a directory's
    prefix ``P/``, ``P.swarm`` beside it (so the directory holds only its own files)."""
    return (key[:-1] if key.endswith("/") else key) + MANIFEST_SUFFIX


def torrent_key(key: str) -> str:
    return (key[:-1] if key.endswith("/") else key) + TORRENT_SUFFIX


def _files(raw: Any) -> tuple[FileEntry, ...] | None:
    if raw is None:
        return None
    entries = tuple(
        FileEntry(_typed(e["path"], str), _typed(e["size"], int), _typed(e["sha256"], str))
        for e in _typed(raw, list)
    )
    check_files(entries)  # ManifestError: unsafe, duplicate or unordered paths
    return entries


def _check_tree_info(info: dict[bytes, Any], files: tuple[FileEntry, ...], bad: Any) -> None:
    """The metainfo's ``files`` must list exactly the manifest's files: libtorrent writes
    what the metainfo says, so a path there that the manifest does not name is refused."""
    try:
        listed = _typed(info[b"files"], list)
        if len(listed) != len(files):
            raise ValueError(f"{len(listed)} files in the metainfo, {len(files)} in the manifest")
        for raw, entry in zip(listed, files, strict=True):
            raw = _typed(raw, dict)
            parts = [_typed(p, bytes).decode() for p in _typed(raw[b"path"], list)]
            if "/".join(parts) != entry.path or "/" in "".join(parts):
                raise ValueError(f"metainfo path {parts!r} is not {entry.path!r}")
            if _typed(raw[b"length"], int) != entry.size:
                raise ValueError(f"metainfo length of {entry.path!r} differs")
            attr = raw.get(b"attr", b"")
            if b"path.utf-8" in raw or b"symlink path" in raw or not isinstance(attr, bytes):
                raise ValueError(f"metainfo entry of {entry.path!r} has extra path fields")
            if b"l" in attr or b"p" in attr:
                raise ValueError(f"metainfo entry of {entry.path!r} is a symlink or padding")
    except (ValueError, KeyError, TypeError) as error:
        raise bad(f"metainfo files: {error}") from error


def _typed(value: Any, kind: type) -> Any:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__}")
    return value


def _sign(body: dict[str, Any], secret: str) -> str:
    canonical = json.dumps(
        {k: v for k, v in body.items() if k != "signature"}, sort_keys=True
    ).encode()
    return hmac.new(secret.encode(), canonical, hashlib.sha256).hexdigest()
