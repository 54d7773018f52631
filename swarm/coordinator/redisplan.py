"""The planner's state in Redis (:class:`RedisPlanState`), so that several coordinators
plan one fleet's origin reads (``swarm coordinator --store redis://HOST:PORT/DB``, issue 12).

Same contract as :class:`swarm.coordinator.planstate.MemoryPlanState`; a planning commit
(bitfield change, stripe claims) runs as one Lua script
(:mod:`swarm.coordinator.redisscripts`). Its keys (the ``planning``
entries) and the conventions it shares with the peer store are described in
:mod:`swarm.coordinator.redisstore`, whose ``PREFIX`` it uses.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

import redis

from swarm.coordinator.planstate import (
    _COUNT_BYTES,
    ESTIMATE_SAMPLE,
    MAX_ARTIFACTS,
    STATE_BUDGET,
    ArtifactView,
    Commit,
    Committed,
    GeometryError,
    PlanState,
    set_bits,
)
from swarm.coordinator.rates import NodeRates, spare_upload
from swarm.coordinator.redisscripts import COMMIT, FORGET, LOAD
from swarm.coordinator.redisstore import PREFIX
from swarm.policy import MixState, Mode

# -- the plan state ---------------------------------------------------------------------------


def _to_bitfield(value: int, count: int) -> bytes:
    """bit i = piece i -> BitTorrent order (piece 0 = high bit of byte 0), as Redis'
    SETBIT/BITPOS number bits."""
    if not count:
        return b""
    text = format(value, f"0{count}b")[::-1]
    pad = -count % 8
    return int(text + "0" * pad, 2).to_bytes((count + 7) // 8, "big")


def _from_bitfield(blob: bytes | None, count: int) -> int:
    if not blob or not count:
        return 0
    blob = blob[: (count + 7) // 8].ljust((count + 7) // 8, b"\0")
    text = format(int.from_bytes(blob, "big"), f"0{len(blob) * 8}b")[:count]
    return int(text[::-1], 2)


def _mix_to_json(state: MixState | None) -> dict[str, object] | None:
    return None if state is None else {"mode": state.mode.value, "since": state.pending_since}


def _mix_from_json(data: dict[str, object] | None) -> MixState | None:
    if not data:
        return None
    return MixState(Mode(data["mode"]), data.get("since"))  # type: ignore[arg-type]


class RedisPlanState(PlanState):
    """The planner's state in Redis: :meth:`load` is one pipelined round trip, and
    :meth:`commit` one Lua script (the same algorithm as
    :class:`swarm.coordinator.planstate.MemoryPlanState`)."""

    def __init__(
        self, client: redis.Redis, max_artifacts: int = MAX_ARTIFACTS, budget: int = STATE_BUDGET
    ) -> None:
        self.redis = client
        self.max_artifacts = max_artifacts
        self.budget = budget
        self._load = client.register_script(LOAD)
        self._commit = client.register_script(COMMIT)
        self._forget = client.register_script(FORGET)
        self._geometries: dict[str, tuple[int, int]] = {}
        self._loaded: dict[tuple[str, str], tuple[int, int]] = {}
        """(node, info_hash) -> (its bitfield as of :meth:`load`, piece count), for
        :meth:`commit`'s diff."""

    @staticmethod
    def _k(*parts: str) -> str:
        return PREFIX + ":".join(parts)

    def _geometry(self, info_hash: str) -> tuple[int, int] | None:
        piece_size, count = self.redis.hmget(self._k("art", info_hash), ["piece_size", "count"])
        if piece_size is None or count is None:
            return None
        return int(piece_size), int(count)

    def check(self, info_hash: str, piece_size: int, count: int) -> None:
        # an info-hash names its geometry: a cached one is right unless the artifact was
        # forgotten and started again, which a mismatch re-reads
        known = self._geometries.get(info_hash)
        if known is None or known != (piece_size, count):
            known = self._geometry(info_hash)
            if known is not None:
                if len(self._geometries) >= MAX_ARTIFACTS:
                    self._geometries.clear()
                self._geometries[info_hash] = known
        if known is not None and known != (piece_size, count):
            raise GeometryError(
                f"artifact {info_hash} has {known[1]} pieces of {known[0]} bytes "
                f"here, not {count} of {piece_size}"
            )

    def load(self, node: str, info_hash: str, piece_size: int, count: int) -> ArtifactView | None:
        k = self._k
        reply = self._load(
            keys=[
                k("art", info_hash),
                k("union", info_hash),
                k("held", info_hash, node),
                k("rec", info_hash),
                k("s3", info_hash),
                k("arts", node),
                k("artifacts"),
                k("planbytes"),
            ],
            args=[node, info_hash, ESTIMATE_SAMPLE],
        )
        art = reply[0:4]
        union, held, rec, own_s3 = reply[4:8]
        holding, artifacts, used = int(reply[8]), int(reply[9]), int(reply[10] or 0)
        sample = reply[11:]
        if art[0] is None:
            cost = count * _COUNT_BYTES + (count + 7) // 8 + 64
            if artifacts >= self.max_artifacts or used + cost > self.budget:
                return None
            pipe = self.redis.pipeline(transaction=False)
            pipe.hsetnx(k("art", info_hash), "count", count)
            pipe.hsetnx(k("art", info_hash), "piece_size", piece_size)
            pipe.sadd(k("artifacts"), info_hash)
            created = pipe.execute()[0]
            if created:
                self.redis.incrby(k("planbytes"), count * _COUNT_BYTES)
            self.check(info_hash, piece_size, count)  # another coordinator's first report
        elif not holding and used + (count + 7) // 8 + 64 > self.budget:
            return None
        self._loaded[(node, info_hash)] = (_from_bitfield(held, count), count)
        pairs = list(zip(sample[::2], sample[1::2], strict=True)) if sample else []
        readers = tuple((n.decode(), float(v)) for n, v in pairs)
        if own_s3 is not None:
            readers = ((node, float(own_s3)), *[r for r in readers if r[0] != node])
        record = json.loads(rec) if rec else {}
        return ArtifactView(
            _from_bitfield(union, count),
            float(art[2]) if art[2] is not None else None,
            float(art[3]) if art[3] is not None else None,
            readers,
            NodeRates.from_json(record["rates"]) if record.get("rates") else None,
            _mix_from_json(record.get("mode")),
        )

    def commit(self, change: Commit) -> Committed:
        node, ih = change.node, change.info_hash
        old, count = self._loaded.pop((node, ih), (0, 0))
        new = change.held & ((1 << count) - 1)
        k = self._k
        record = {"rates": change.rates.to_json(), "mode": _mix_to_json(change.mode)}
        if change.complete:
            record["mode"] = None
        reply = self._commit(
            keys=[
                k("art", ih),
                k("avail", ih),
                k("union", ih),
                k("assigned", ih),
                k("owner", ih),
                k("owners", ih),
                k("progress", ih),
                k("stripelen", ih),
                k("wide", ih),
                k("s3", ih),
                k("rec", ih),
                k("held", ih, node),
                k("stripe", ih, node),
                k("arts", node),
                k("planbytes"),
                k("tmp", ih),
            ],
            args=[
                node,
                ih,
                repr(change.now),
                repr(change.stall_seconds),
                change.max_readers,
                int(change.complete),
                int(change.wide),
                change.want,
                _to_bitfield(new, count),
                json.dumps(record),
                "" if change.estimate is None else repr(change.estimate),
                repr(change.rates.down.get("s3", 0.0)),
                count,
                (count + 7) // 8 + 64,
                ",".join(map(str, set_bits(new & ~old))),
                ",".join(map(str, set_bits(old & ~new))),
                k("stripe", ih, ""),
                ",".join(map(str, set_bits(old & new))),
                int(change.streaming),
            ],
        )
        return Committed(sorted(int(p) for p in reply[1:]), bool(reply[0]))

    def forget(self, nodes: Iterable[str]) -> None:
        for node in nodes:
            for raw in self.redis.smembers(self._k("arts", node)):
                self._forget_artifact(node, raw.decode())

    def forget_unlisted(self, node: str, listed: Iterable[str]) -> None:
        # one SMEMBERS per report; the FORGET script is run only for an artifact dropped
        keep = set(listed)
        for ih in (raw.decode() for raw in self.redis.smembers(self._k("arts", node))):
            if ih not in keep:
                self._forget_artifact(node, ih)

    def _forget_artifact(self, node: str, ih: str) -> None:
        """Drop ``node``'s bitfield, stripe and records for one artifact (the FORGET
        script; a no-op if another coordinator did it first)."""
        k = self._k
        geometry = self._geometry(ih)
        count = geometry[1] if geometry else 0
        held = _from_bitfield(self.redis.get(k("held", ih, node)), count)
        per_artifact = [
            k(name, ih)
            for name in (
                "art", "avail", "union", "assigned", "owner", "owners", "progress",
                "stripelen", "wide", "s3", "rec",
            )
        ]  # fmt: skip
        self._forget(
            keys=[
                *per_artifact,
                k("held", ih, node),
                k("arts", node),
                k("planbytes"),
                k("artifacts"),
            ],
            args=[
                node,
                ih,
                ",".join(map(str, set_bits(held))),
                (count + 7) // 8 + 64,
                k("stripe", ih, ""),
                count * _COUNT_BYTES,
                " ".join(per_artifact),
            ],
        )

    def known_nodes(self) -> set[str]:
        return set()  # departed nodes come from the peer store's sweep (forget)

    def availability(self, info_hash: str) -> list[int]:
        geometry = self._geometry(info_hash)
        if geometry is None:
            return []
        count = geometry[1]
        raw = (self.redis.get(self._k("avail", info_hash)) or b"").ljust(4 * count, b"\0")
        return [int.from_bytes(raw[4 * i : 4 * i + 4], "big") for i in range(count)]

    def _record(self, node: str, info_hash: str) -> dict:  # type: ignore[type-arg]
        raw = self.redis.hget(self._k("rec", info_hash), node)
        return json.loads(raw) if raw else {}

    def node_rates(self, node: str, info_hash: str) -> NodeRates | None:
        record = self._record(node, info_hash)
        return NodeRates.from_json(record["rates"]) if record.get("rates") else None

    def node_mode(self, node: str, info_hash: str) -> MixState | None:
        return _mix_from_json(self._record(node, info_hash).get("mode"))

    def spare_upload(self, node: str) -> float:
        arts = [a.decode() for a in self.redis.smembers(self._k("arts", node))]
        rates = (self.node_rates(node, ih) for ih in arts)
        return spare_upload(r for r in rates if r is not None)
