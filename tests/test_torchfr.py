"""torch's own flight recorder as the rank reads it (lab.rank.torchfr) and as --fr-dir writes it for
torch's analyzer; the new fields of a record (who issued it, its caller, a world size) read as
untrusted data. The real path (DDP's C++ collectives in a running job, torch's analyzer on the
dumps) is in test_train_programs.py and test_trace.py."""
from __future__ import annotations

from lab.core.rankview import describe, place
from lab.rank import torchfr
from lab.rank.flightrecords import read_record
from lab.rank.record import Record

ENTRY = {"record_id": 3, "collective_seq_id": 4, "p2p_seq_id": 0, "process_group": ["0", "default_pg"],
         "profiling_name": "gloo:all_reduce", "input_sizes": [[1348]], "input_dtypes": ["Float"],
         "retired": False, "time_created_ns": 1_795_836_401_291_341_172}


def test_an_entry_reads_as_the_public_function_names_its_op_size_and_dtype() -> None:
    assert (torchfr.op_of(ENTRY), torchfr.shape_of(ENTRY), torchfr.dtype_of(ENTRY)) == ("all_reduce", [1348],
                                                                                        "float32")
    assert torchfr.op_of({"profiling_name": "gloo:allreduce_coalesced"}) == "all_reduce_coalesced"
    assert torchfr.op_of({"profiling_name": "gloo:_allgather_base"}) == "all_gather_into_tensor"
    assert torchfr.group_name(ENTRY) == "0"
    assert (torchfr.shape_of({"input_sizes": "x"}), torchfr.dtype_of({"input_dtypes": [3]})) == (None, None)


def test_a_gloo_dump_is_given_the_pg_config_torch_s_analyzer_needs() -> None:
    dump = {"version": "2.10", "pg_config": {"": {"name": "", "desc": "", "ranks": "[]"}}, "entries": [ENTRY],
            "pg_status": {}}
    fixed = torchfr.analyzable(dump, {"0": [0, 1, 2, 3], "1": [0, 1]})
    assert fixed["pg_config"] == {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"},
                                  "1": {"name": "1", "desc": "undefined", "ranks": "[0, 1]"}}
    assert fixed["entries"] == [{"frames": [], **ENTRY}] and fixed["version"] == "2.10"


def test_who_issued_a_call_and_its_caller_are_read_as_text_and_shown() -> None:
    raw = {"seq": 11, "group": "world", "op": "all_reduce", "state": "waiting", "t0": 1.0, "numel": 1348,
           "dtype": "float32", "where": "_common.py:35", "by": "DDP's gradient",
           "caller": "train.py:21\x1b[2J and more"}
    call = read_record(raw)
    assert isinstance(call, Record)
    assert describe(call) == "DDP's gradient all_reduce #11, 1348 floats"  # (no "in wait()": torch waits)
    assert place(call) is not None and place(call).startswith("_common.py:35 (called at train.py:21")
    assert "\x1b" not in (place(call) or "")
    assert read_record({**raw, "by": 3}) == "by"
    assert read_record({**raw, "world_size": 0}) == "world_size"
    assert isinstance(read_record({**raw, "world_size": 4}), Record)
