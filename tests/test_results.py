"""Recorder: flushes convert only new rows, yet write what a full build would."""

from __future__ import annotations

import pyarrow.parquet as pq

from fedsim.results import CLIENT_SCHEMA, Recorder, rows_table


def client_row(i: int, **extra) -> dict:
    return {
        "round": i,
        "client_id": i % 7,
        "device_group": "phones",
        "tau": 3,
        "t_start": 0.0,
        "t_arrive": 1.5,
        "dropped": False,
        "drop_reason": "",
        "slowdown": 1.0,
        "weight": 0.5,
        "update_norm": 0.1,
        "train_loss": 0.7,
        "bytes_down": 10,
        "bytes_up": 10,
        **extra,
    }


def test_each_flush_writes_what_converting_every_row_would(tmp_path):
    # Prepare: batches that add an extra column late, first as nulls, then
    # as ints, then as floats (the column's type changes twice)
    batches = [
        [client_row(i) for i in range(5)],
        [client_row(i, flag=None) for i in range(5, 8)],
        [client_row(i, flag=i) for i in range(8, 10)],
        [],
        [client_row(i, flag=i + 0.5) for i in range(10, 12)],
        [client_row(i, flag=1) for i in range(12, 15)],
    ]
    rec = Recorder(tmp_path)
    for batch in batches:
        # Execute
        rec.add({}, batch)
        rec._write(tmp_path / "clients.parquet", rec.clients, CLIENT_SCHEMA)

        # Assert
        written = pq.read_table(tmp_path / "clients.parquet")
        assert written.equals(rows_table(rec.clients, CLIENT_SCHEMA))
    assert written.schema.field("flag").type == "double"
    assert written.num_rows == 15
