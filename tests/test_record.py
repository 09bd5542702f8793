"""The one schema of a flight record (lab.rank.record): what a writer puts on the wire, the reader
takes back as it was; what the reader refuses, it names; and every writer writes that schema."""
from __future__ import annotations

import json
from dataclasses import MISSING, fields, replace
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from lab.rank import lastcall
from lab.rank.flightrecords import read_record
from lab.rank.record import INT_MAX, SCHEMA, SPLITS_MAX, STATES, Record, from_wire, to_wire

counts = st.integers(0, INT_MAX)
texts = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40)
times = st.floats(0, 4e9, allow_nan=False)
records = st.builds(
    Record, seq=st.integers(1, INT_MAX), group=texts, op=texts, state=st.sampled_from(STATES), t0=times,
    t1=st.none() | times, numel=st.none() | counts, shape=st.none() | st.lists(counts, max_size=16).map(tuple),
    dtype=st.none() | texts, peer=st.none() | counts, root=st.none() | counts,
    tag=st.none() | st.integers(-INT_MAX, INT_MAX), reduce_op=st.none() | texts, is_async=st.booleans(),
    where=st.none() | texts, error=st.none() | texts, by=st.none() | texts, world_size=st.none() | st.integers(1, 64),
    caller=st.none() | texts, in_splits=st.none() | st.lists(counts, min_size=1, max_size=64).map(tuple),
    out_splits=st.none() | st.lists(counts, min_size=1, max_size=64).map(tuple))


def as_given(text: str, value: str) -> str:
    return value


@given(records)
def test_a_record_comes_back_from_the_wire_as_it_was_written(record: Record) -> None:
    line = json.dumps(to_wire(record))  # (as an event line carries it)
    assert from_wire(json.loads(line), as_given) == record


@given(records)
def test_the_wire_has_every_field_of_the_schema_but_the_empty_sparse_ones(record: Record) -> None:
    wire = to_wire(record)
    expected = {w.key for name, w in SCHEMA.items() if not w.sparse or getattr(record, name)}
    assert set(wire) == expected


WRONG: dict[str, list[Any]] = {  # a field's kind -> values that are not of it
    "count": [-1, "1", 1.5, True, 1 << 70], "int": ["1", 1.5, True, 1 << 70],
    "time": ["now", True, float("nan"), float("inf")], "bool": ["yes", 1, 0], "text": [1, ["a"], {"a": 1}],
    "shape": ["4", [-1], [1] * 17, [1.5]], "splits": ["4", [-1], [], [1] * (SPLITS_MAX + 1), [True]],
    "state": ["gone", 1, ["done"]]}


@given(records, st.sampled_from(sorted(SCHEMA)), st.data())
def test_a_field_of_another_kind_refuses_the_record_by_its_name(record: Record, name: str, data: st.DataObject) -> None:
    wire, key = to_wire(record), SCHEMA[name].key
    value = data.draw(st.sampled_from(WRONG[SCHEMA[name].kind]))
    assert from_wire({**wire, key: value}, as_given) == key
    if SCHEMA[name].required:
        assert from_wire({k: v for k, v in wire.items() if k != key}, as_given) == key


def test_the_schema_is_the_records_own_field_for_field() -> None:
    assert list(SCHEMA) == [f.name for f in fields(Record)]
    assert [name for name, w in SCHEMA.items() if w.required] == [f.name for f in fields(Record)
                                                                  if f.default is MISSING]


def test_the_relays_page_writes_the_schema() -> None:
    page = lastcall.Page(1, "t0k3n")
    marker: list[Any] = []
    page.begin(marker, 7, 1732530000.5, 2, None, (3, 4), b"recv", b"float32", b"g0,2#0", b"train.py:9")
    said = page.call()
    assert read_record(said) == Record(7, "g0,2#0", "recv", "in_flight", 1732530000.5, numel=12, shape=(3, 4),
                                       dtype="float32", peer=2, where="train.py:9")
    page.ended(marker)
    assert page.call() is None


def test_the_reader_shows_texts_cut_and_printable() -> None:
    record = Record(1, "world", "all_reduce", "raised", 1.0, error="RuntimeError: \x1b[31m" + "x" * 400)
    read = read_record(to_wire(record))
    assert isinstance(read, Record) and read.error is not None
    assert "\\x1b" in read.error and len(read.error) < 200 and read == replace(record, error=read.error)
