"""Record logic without storage: modify ops, query filters, sorting, paging, replica merges."""

from __future__ import annotations

import base64
import binascii
import copy
import functools
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from anyrtd.devserver.errors import bad_request

Record = dict[str, Any]
Stamp = tuple[int, str]
"""Who wrote a field when: (hybrid logical clock in microseconds, writer's peer id)."""

RESERVED = frozenset({"id", "_v", "_updatedAt", "_deleted"})
"""Keys of the flat record shape that are not fields: never stored, never written."""

OP_TYPES = ("$set", "$unset", "$inc")
FILTER_OPS = ("$gt", "$gte", "$lt", "$lte", "$in", "$exists")
MAX_LIMIT = 10_000


@dataclass(frozen=True)
class Op:
    """One modify op: `$set`, `$unset` or `$inc` at a dotted path (`()` is the whole record)."""

    kind: str
    path: tuple[str, ...]
    value: Any = None


@dataclass
class Delta:
    """A replicated write of one record: top-level fields set or unset, or a tombstone."""

    stamp: Stamp
    set: dict[str, Any] = field(default_factory=dict)
    unset: list[str] = field(default_factory=list)
    delete: bool = False

    def to_json(self) -> dict[str, Any]:
        """Return the delta as stored in the sync queue."""
        return {
            "stamp": list(self.stamp),
            "set": self.set,
            "unset": self.unset,
            "delete": self.delete,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Delta:
        """Read a delta written by `to_json`."""
        hlc, peer = raw["stamp"]
        return cls(
            stamp=(int(hlc), str(peer)),
            set=dict(raw["set"]),
            unset=list(raw["unset"]),
            delete=bool(raw["delete"]),
        )


def type_name(value: Any) -> str:
    """Return the JSON name of a value's type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def is_number(value: Any) -> bool:
    """Tell whether a JSON value is a number (booleans are not)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


# writes


def parse_path(raw: Any, where: str, *, allow_root: bool) -> tuple[str, ...]:
    """Split a dotted path; refuse empty segments and reserved top-level names."""
    if not isinstance(raw, str):
        raise bad_request(f'{where}.path: expected a string like "a.b", got {type_name(raw)}')
    if raw == "":
        if allow_root:
            return ()
        raise bad_request(f'{where}.path: "" (the whole record) is only allowed with $set')
    parts = tuple(raw.split("."))
    if any(p == "" for p in parts):
        raise bad_request(f'{where}.path: "{raw}" has an empty segment')
    if parts[0] in RESERVED:
        raise bad_request(f'{where}.path: "{parts[0]}" is reserved, not a field')
    return parts


def parse_ops(raw: Any, where: str) -> list[Op]:
    """Validate a modify record's `ops` list."""
    if not isinstance(raw, list):
        raise bad_request(f"{where}.ops: expected a list of ops, got {type_name(raw)}")
    ops = []
    for i, item in enumerate(raw):
        at = f"{where}.ops[{i}]"
        if not isinstance(item, dict):
            raise bad_request(
                f'{at}: expected an object like {{"type": "$set", "path": "a", "value": 1}}'
            )
        kind = item.get("type")
        if kind not in OP_TYPES:
            raise bad_request(f"{at}.type: expected one of {', '.join(OP_TYPES)}, got {kind!r}")
        path = parse_path(item.get("path"), at, allow_root=kind == "$set")
        if kind == "$unset":
            ops.append(Op(kind, path))
            continue
        if "value" not in item:
            raise bad_request(f"{at}: {kind} needs a value")
        value = item["value"]
        if kind == "$set" and path == () and not isinstance(value, dict):
            raise bad_request(
                f'{at}.value: $set with path "" needs an object, got {type_name(value)}'
            )
        if kind == "$inc" and not is_number(value):
            raise bad_request(f"{at}.value: $inc needs a number, got {type_name(value)}")
        ops.append(Op(kind, path, value))
    return ops


def clean_fields(raw: Any, record_id: str, where: str) -> dict[str, Any]:
    """Return the fields of a written value without the keys of the flat record shape."""
    if not isinstance(raw, dict):
        raise bad_request(f"{where}: expected an object of fields, got {type_name(raw)}")
    if "id" in raw and raw["id"] != record_id:
        raise bad_request(
            f"{where}.id: {raw['id']!r} differs from the record id {record_id!r}; "
            "the id of a record cannot change"
        )
    return {k: v for k, v in raw.items() if k not in RESERVED}


def apply_ops(
    fields: Mapping[str, Any], ops: Sequence[Op], record_id: str, where: str
) -> tuple[dict[str, Any], set[str]]:
    """Apply ops in order; return the new fields and the top-level keys they wrote."""
    out = copy.deepcopy(dict(fields))
    touched: set[str] = set()
    for i, op in enumerate(ops):
        at = f"{where}.ops[{i}]"
        if op.path == ():
            new = clean_fields(op.value, record_id, f"{at}.value")
            touched |= set(out) | set(new)
            out = copy.deepcopy(new)
            continue
        touched.add(op.path[0])
        parent = _parent(out, op.path, create=op.kind != "$unset", where=at)
        leaf = op.path[-1]
        if parent is None:
            continue
        if op.kind == "$set":
            parent[leaf] = copy.deepcopy(op.value)
        elif op.kind == "$unset":
            parent.pop(leaf, None)
        else:
            current = parent.get(leaf, 0)
            if not is_number(current):
                raise bad_request(
                    f"{at}: cannot $inc {'.'.join(op.path)}: "
                    f"it holds a {type_name(current)}, not a number"
                )
            total = current + op.value
            if isinstance(total, float) and not math.isfinite(total):
                raise bad_request(f"{at}: $inc of {'.'.join(op.path)} overflows")
            parent[leaf] = total
    return out, touched


def _parent(
    root: dict[str, Any], path: tuple[str, ...], *, create: bool, where: str
) -> dict[str, Any] | None:
    node = root
    for depth, seg in enumerate(path[:-1]):
        if seg not in node:
            if not create:
                return None
            node[seg] = {}
        child = node[seg]
        if not isinstance(child, dict):
            if not create:
                return None
            walked = ".".join(path[: depth + 1])
            raise bad_request(
                f"{where}: path {'.'.join(path)}: {walked} holds a "
                f"{type_name(child)}, not an object"
            )
        node = child
    return node


def merge(
    fields: Mapping[str, Any], clocks: Mapping[str, Stamp], delta: Delta
) -> tuple[dict[str, Any], dict[str, Stamp], bool]:
    """Merge a replicated delta field by field (newer stamp wins): fields, clocks, changed."""
    out = dict(fields)
    stamps = dict(clocks)
    changed = False
    writes: list[tuple[str, bool, Any]] = [(k, True, v) for k, v in delta.set.items()]
    writes += [(k, False, None) for k in delta.unset]
    for key, present, value in writes:
        seen = stamps.get(key)
        if seen is not None and tuple(seen) >= delta.stamp:
            continue
        stamps[key] = delta.stamp
        if present:
            if key not in out or not json_equal(out[key], value):
                changed = True
            out[key] = value
        elif key in out:
            del out[key]
            changed = True
    return out, stamps, changed


# reads


def get_path(record: Mapping[str, Any], path: Sequence[str]) -> tuple[bool, Any]:
    """Return (present, value) of a dotted path in a flat record."""
    node: Any = record
    for seg in path:
        if not isinstance(node, dict) or seg not in node:
            return False, None
        node = node[seg]
    return True, node


def json_equal(a: Any, b: Any) -> bool:
    """Compare JSON values the JSON way: `true` is not `1`, `1` is `1.0`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if is_number(a) and is_number(b):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


@dataclass(frozen=True)
class Condition:
    path: tuple[str, ...]
    op: str
    value: Any


def compile_filter(raw: Any) -> list[Condition]:
    """Validate a query filter: field equality, or an object of `$` operators per field."""
    if raw is None:
        return []
    if not isinstance(raw, dict):
        raise bad_request(
            f'filter: expected an object like {{"field": value}}, got {type_name(raw)}'
        )
    out = []
    for name, cond in raw.items():
        if not name or any(p == "" for p in name.split(".")):
            raise bad_request(f"filter: field name {name!r} is empty or has an empty segment")
        path = tuple(name.split("."))
        ops = isinstance(cond, dict) and any(k.startswith("$") for k in cond)
        if not ops:
            out.append(Condition(path, "$eq", cond))
            continue
        for op, value in cond.items():
            where = f"filter.{name}.{op}"
            if op not in FILTER_OPS:
                raise bad_request(
                    f"filter.{name}: unknown operator {op!r}; supported: "
                    f"{', '.join(FILTER_OPS)} (or a plain value for equality)"
                )
            if op == "$in" and not isinstance(value, list):
                raise bad_request(f"{where}: expected a list, got {type_name(value)}")
            if op == "$exists" and not isinstance(value, bool):
                raise bad_request(f"{where}: expected true or false, got {type_name(value)}")
            if op in ("$gt", "$gte", "$lt", "$lte") and not (
                is_number(value) or isinstance(value, str)
            ):
                raise bad_request(f"{where}: expected a number or a string, got {type_name(value)}")
            out.append(Condition(path, op, value))
    return out


def matches(record: Mapping[str, Any], conditions: Iterable[Condition]) -> bool:
    """Tell whether a flat record satisfies every condition."""
    return all(_holds(record, c) for c in conditions)


def _holds(record: Mapping[str, Any], c: Condition) -> bool:
    present, value = get_path(record, c.path)
    if c.op == "$exists":
        return present is c.value
    if c.op == "$eq":
        if c.value is None:
            return value is None
        return present and json_equal(value, c.value)
    if not present:
        return False
    if c.op == "$in":
        return any(json_equal(value, v) for v in c.value)
    comparable = (is_number(value) and is_number(c.value)) or (
        isinstance(value, str) and isinstance(c.value, str)
    )
    if not comparable:
        return False
    if c.op == "$gt":
        return bool(value > c.value)
    if c.op == "$gte":
        return bool(value >= c.value)
    if c.op == "$lt":
        return bool(value < c.value)
    return bool(value <= c.value)


SortKey = tuple[tuple[str, ...], bool]


def compile_sort(raw: Any) -> list[SortKey]:
    """Validate a sort list: field names, `-` in front for descending."""
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise bad_request(
            f'sort: expected a list of field names like ["-startedAt"], got {type_name(raw)}'
        )
    out = []
    for i, item in enumerate(raw):
        if not isinstance(item, str) or item in ("", "-"):
            raise bad_request(f"sort[{i}]: expected a field name, got {item!r}")
        desc = item.startswith("-")
        name = item[1:] if desc else item
        if any(p == "" for p in name.split(".")):
            raise bad_request(f"sort[{i}]: field name {name!r} has an empty segment")
        out.append((tuple(name.split(".")), desc))
    return out


_RANKS = {"null": 1, "boolean": 2, "number": 3, "string": 4, "array": 5, "object": 6}


def compare_values(a: tuple[bool, Any], b: tuple[bool, Any]) -> int:
    """Order JSON values: missing, null, booleans, numbers, strings, arrays, objects."""
    ra = _RANKS[type_name(a[1])] if a[0] else 0
    rb = _RANKS[type_name(b[1])] if b[0] else 0
    if ra != rb:
        return -1 if ra < rb else 1
    x, y = a[1], b[1]
    if ra in (5, 6):
        x, y = canonical(x), canonical(y)
    if ra in (0, 1) or x == y:
        return 0
    return -1 if x < y else 1


def canonical(value: Any) -> str:
    """Return one stable JSON text for a value."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _position(record: Mapping[str, Any], keys: Sequence[SortKey]) -> list[tuple[bool, Any]]:
    return [get_path(record, path) for path, _ in keys]


def _compare_positions(
    a: tuple[list[tuple[bool, Any]], str],
    b: tuple[list[tuple[bool, Any]], str],
    keys: Sequence[SortKey],
) -> int:
    for (_, desc), x, y in zip(keys, a[0], b[0], strict=True):
        c = compare_values(x, y)
        if c:
            return -c if desc else c
    return (a[1] > b[1]) - (a[1] < b[1])


@dataclass(frozen=True)
class Page:
    records: list[Record]
    next: str | None


def fingerprint(*parts: Any) -> str:
    """Return a short digest of a query's shape, so a `next` token fits only its own query."""
    return hashlib.sha256(canonical(list(parts)).encode()).hexdigest()[:16]


def run_query(
    records: Iterable[Record],
    conditions: Sequence[Condition],
    keys: Sequence[SortKey],
    *,
    limit: int | None,
    after: str | None,
    shape: str,
) -> Page:
    """Filter, sort (ties by id) and page flat records; `shape` is the query's fingerprint."""
    start = decode_token(after, shape) if after is not None else None
    rows = [r for r in records if matches(r, conditions)]
    cmp = functools.partial(_compare_positions, keys=keys)
    decorated = [((_position(r, keys), str(r["id"])), r) for r in rows]
    decorated.sort(key=lambda pair: functools.cmp_to_key(cmp)(pair[0]))
    if start is not None:
        decorated = [d for d in decorated if cmp(d[0], start) > 0]
    if limit is None or len(decorated) <= limit:
        return Page([r for _, r in decorated], None)
    page = decorated[:limit]
    last_pos, last_id = page[-1][0]
    return Page([r for _, r in page], encode_token(shape, last_pos, last_id))


def page_by_id(
    records_after: Callable[[str | None], Iterable[Record]],
    conditions: Sequence[Condition],
    *,
    limit: int | None,
    after: str | None,
    shape: str,
) -> Page:
    """Filter and page flat records of a query without a sort (so in id order).

    `records_after(last_id)` yields the records past `last_id` in id order: the page stops
    reading once it is full, so paging through a dataset reads each record about once
    instead of the whole dataset for every page. Pages and tokens are those `run_query`
    gives for the same query.
    """
    last = decode_token(after, shape)[1] if after is not None else None
    # A look-up by id: no record past that id, in id order, can match (the daemon looks up
    # its chat-watch record so at every start, in a dataset of maybe 100,000).
    ids = [c.value for c in conditions if c.path == ("id",) and c.op == "$eq"]
    upto = min(ids) if ids and all(isinstance(i, str) for i in ids) else None
    rows: list[Record] = []
    for r in records_after(last):
        if upto is not None and r["id"] > upto:
            break
        if matches(r, conditions):
            rows.append(r)
            if limit is not None and len(rows) > limit:
                break
    if limit is None or len(rows) <= limit:
        return Page(rows, None)
    page = rows[:limit]
    return Page(page, encode_token(shape, [], str(page[-1]["id"])))


def encode_token(shape: str, position: list[tuple[bool, Any]], last_id: str) -> str:
    """Return the opaque `next` token that resumes after (position, id)."""
    raw = canonical({"q": shape, "k": [[p, v] for p, v in position], "id": last_id})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_token(token: Any, shape: str) -> tuple[list[tuple[bool, Any]], str]:
    """Read a `next` token; refuse one that is garbled or belongs to another query."""
    if not isinstance(token, str) or not token:
        raise bad_request("after: expected the `next` token of the previous page")
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        position = [(bool(p), v) for p, v in raw["k"]]
        last_id = str(raw["id"])
        token_shape = raw["q"]
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise bad_request(
            "after: not a token this server issued; pass the `next` value "
            "of the previous page unchanged"
        ) from None
    if token_shape != shape:
        raise bad_request(
            "after: the token belongs to a query with another objectId, dataset, "
            "filter, sort or includeDeleted; page with the same query"
        )
    return position, last_id
