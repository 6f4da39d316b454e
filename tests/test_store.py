"""Parquet tensor store: round trip, byte-identical files, zero-copy reads, atomic writes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from parity.core import store


def tensors(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for s in range(2):
        out.append(store.Tensor(s, "conv1", 0, rng.standard_normal((1, 4, 5, 5)).astype(np.float32)))
        out.append(store.Tensor(s, "fc#1", 1, rng.standard_normal((3,)).astype(np.float16)))
        out.append(store.Tensor(s, "ids", 2, rng.integers(0, 9, (2, 3))))
        out.append(store.Tensor(s, "output", 3, rng.standard_normal((2, 2))))
    return out


def test_round_trip_keeps_names_order_dtype_shape_and_values(tmp_path):
    ts = tensors()
    assert store.write(tmp_path / "t.parquet", ts, {"model": "m"}) == len(ts)
    back = list(store.read(tmp_path / "t.parquet"))
    assert [(t.sample, t.name, t.order) for t in back] == [(t.sample, t.name, t.order) for t in ts]
    for a, b in zip(back, ts):
        assert a.array.dtype == b.array.dtype and a.array.shape == b.array.shape
        np.testing.assert_array_equal(a.array, b.array)
    assert store.read_metadata(tmp_path / "t.parquet") == {"model": "m"}


def test_identical_tensors_give_byte_identical_files(tmp_path):
    store.write(tmp_path / "a.parquet", tensors(), {"k": "v"})
    store.write(tmp_path / "b.parquet", tensors(), {"k": "v"})
    assert (tmp_path / "a.parquet").read_bytes() == (tmp_path / "b.parquet").read_bytes()
    store.write(tmp_path / "c.parquet", tensors(seed=1), {"k": "v"})
    assert (tmp_path / "a.parquet").read_bytes() != (tmp_path / "c.parquet").read_bytes()


def test_reads_are_zero_copy_views(tmp_path):
    store.write(tmp_path / "t.parquet", tensors())
    for t in store.read(tmp_path / "t.parquet"):
        assert not t.array.flags.owndata and not t.array.flags.writeable


def test_layout_is_zstd_with_byte_stream_split_floats(tmp_path):
    store.write(tmp_path / "t.parquet", tensors())
    meta = pq.ParquetFile(tmp_path / "t.parquet").metadata
    cols = {meta.schema.column(c).path: meta.row_group(0).column(c) for c in range(meta.num_columns)}
    assert all(c.compression == "ZSTD" for c in cols.values())
    for name in ("f4.list.element", "f8.list.element"):
        assert "BYTE_STREAM_SPLIT" in cols[name].encodings
    assert not any("DICTIONARY" in e for c in cols.values() for e in c.encodings)


def test_failed_write_leaves_no_file(tmp_path):
    def interrupted():
        yield tensors()[0]
        raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        store.write(tmp_path / "t.parquet", interrupted())
    assert list(tmp_path.iterdir()) == []


def test_interrupted_write_keeps_the_previous_file_whole(tmp_path):
    from parity.core.io import atomic_path

    store.write(tmp_path / "t.parquet", tensors())
    good = (tmp_path / "t.parquet").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(tmp_path / "t.parquet") as tmp:
            tmp.write_bytes(good[:100])  # half-written
            raise KeyboardInterrupt
    assert (tmp_path / "t.parquet").read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["t.parquet"]


def test_files_get_the_usual_mode_not_mkstemps_0600(tmp_path):
    import os

    store.write(tmp_path / "t.parquet", tensors())
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "t.parquet").stat().st_mode & 0o777 == 0o666 & ~umask


def test_empty_file_reads_as_nothing(tmp_path):
    store.write(tmp_path / "e.parquet", [])
    assert list(store.read(tmp_path / "e.parquet")) == []


def test_rows_from_orders_layers_first_then_outputs():
    rows = store.rows_from(0, [("output", np.zeros(1)), ("a", np.zeros(1)), ("b", np.zeros(1))])
    assert [(r.name, r.order) for r in rows] == [("a", 0), ("b", 1), ("output", 2)]


def _one_buffer_write(path, ts, metadata):
    """The store.write of the earlier format (each tensor's bytes in one binary column `data`,
    uncompressed, no `f4`/`f8`/`same_as` columns): files written before issue 23's disk change."""
    import pyarrow as pa

    names = ["sample", "name", "order", "dtype", "shape", "data"]
    cols = {k: [] for k in names}
    for t in ts:
        a = np.ascontiguousarray(t.array).reshape(np.shape(t.array))  # rank 0 stays rank 0 (issue 25)
        if a.dtype.byteorder == ">":
            a = a.astype(a.dtype.newbyteorder("<"))
        for k, v in zip(names, (t.sample, t.name, t.order, a.dtype.str.lstrip("<|="), list(a.shape), a.tobytes())):
            cols[k].append(v)
    schema = pa.schema([store.SCHEMA.field(k) for k in names]).with_metadata(metadata)
    table = pa.table(cols, schema=schema)
    pq.write_table(table, path, compression="none", use_dictionary=False, write_statistics=False,
                   store_schema=True)


def test_writes_are_deterministic_and_files_of_the_earlier_format_read_the_same(tmp_path):
    rng = np.random.default_rng(3)
    ts = tensors() + [
        store.Tensor(0, "strided", 4, rng.standard_normal((4, 6)).astype(np.float32)[:, ::2]),  # not contiguous
        store.Tensor(0, "big_endian", 5, np.arange(6, dtype=">f8").reshape(2, 3)),
        store.Tensor(1, "empty", 6, np.zeros((0, 3), np.float32)),
        store.Tensor(1, "scalar", 7, np.float64(3.5)),
        store.Tensor(1, "large", 8, rng.standard_normal((8, 64, 56, 56)).astype(np.float32)),  # > one page
    ] + [store.Tensor(s, f"mid{i}", 9 + i, rng.standard_normal((8, 3072))) for s in range(2) for i in range(7)]
    # (the mid-size float64 tensors add up past the 1 MB data page in the middle of the column, as an
    # fp64 reference does: where the writer splits pages must not change)
    # a file of the earlier format (every value as raw bytes in `data`, no compression) reads back the
    # same tensors as the current one; the current one is the same bytes written twice
    store.write(tmp_path / "new.parquet", ts, {"k": "v"})
    store.write(tmp_path / "again.parquet", ts, {"k": "v"})
    assert (tmp_path / "new.parquet").read_bytes() == (tmp_path / "again.parquet").read_bytes()
    _one_buffer_write(tmp_path / "old.parquet", ts, {"k": "v"})
    for f in ("new.parquet", "old.parquet"):
        back = store.read_dict(tmp_path / f)
        for t in ts:
            got = back[(t.sample, t.name)].array
            assert got.shape == np.shape(t.array) and got.dtype == np.asarray(t.array).dtype.newbyteorder("<")
            assert store.same_bytes(got, np.asarray(t.array).astype(got.dtype)), (f, t.name)


def test_a_streamed_file_reads_back_the_same_tensors_and_holds_row_groups_of_the_budget(tmp_path):
    """Large files are written as they are made (store.writer): row groups of about the buffer size,
    read back tensor for tensor as the whole-table write gives them; a file that fits in the buffer
    keeps the whole-table write's bytes."""
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    rows = [store.Tensor(k, f"l{i}", i, rng.standard_normal((8, 16)).astype(np.float32 if i % 2 else np.float64))
            for k in range(3) for i in range(5)]
    store.write(tmp_path / "whole.parquet", rows)
    with store.writer(tmp_path / "fits.parquet") as w:
        w.extend(rows)
    assert (tmp_path / "fits.parquet").read_bytes() == (tmp_path / "whole.parquet").read_bytes()
    with store.writer(tmp_path / "streamed.parquet", budget=2000) as w:
        for t in rows:
            w.add(t)
    assert pq.ParquetFile(tmp_path / "streamed.parquet").num_row_groups > 3
    got = list(store.read(tmp_path / "streamed.parquet"))
    assert [(t.sample, t.name, t.order) for t in got] == [(t.sample, t.name, t.order) for t in rows]
    assert all(np.array_equal(a.array, b.array) and a.array.dtype == b.array.dtype for a, b in zip(got, rows))


def test_a_streamed_write_that_fails_midway_publishes_nothing(tmp_path):
    path = tmp_path / "x.parquet"
    with pytest.raises(RuntimeError):
        with store.writer(path, budget=100) as w:
            for i in range(10):
                w.add(store.Tensor(0, f"l{i}", i, np.ones(64, np.float32)))
            raise RuntimeError("killed")
    assert not path.exists() and not [p for p in tmp_path.iterdir()]


def test_row_groups_encoded_in_the_background_give_the_same_bytes_and_fail_whole(tmp_path):
    """store.Writer(background=True) (the fold's reference and baseline: each row group encoded on a
    thread while the next values are computed) writes byte for byte the file the plain writer writes,
    keeps the same decoded groups, and an encoding that fails leaves no file, the error raised."""
    rng = np.random.default_rng(2)
    rows = [store.Tensor(k, f"l{i}", i, rng.standard_normal((8, 16)).astype(np.float32 if i % 2 else np.float64))
            for k in range(3) for i in range(5)]
    for budget in (2000, None):  # many row groups; one (the whole-table write)
        kept = {}
        for bg in (False, True):
            with store.writer(tmp_path / f"{bg}.parquet", budget=budget, keep_mb=1, background=bg) as w:
                for t in rows:
                    w.add(t)
            kept[bg] = w.kept
        assert (tmp_path / "True.parquet").read_bytes() == (tmp_path / "False.parquet").read_bytes(), budget
        assert [[a.tobytes() for a in g] for g in kept[True]] == [[a.tobytes() for a in g] for g in kept[False]]
    path = tmp_path / "bad.parquet"
    with pytest.raises(pa.ArrowTypeError):
        with store.writer(path, budget=100, background=True) as w:
            w.add(store.Tensor(0, "ok", 0, np.ones(64, np.float32)))
            w.add(store.Tensor(0, 123, 1, np.ones(64, np.float32)))  # a name not a string: Arrow refuses it
            w.add(store.Tensor(0, "next", 2, np.ones(64, np.float32)))
    assert not path.exists() and not [p for p in tmp_path.glob(".*")]


def test_rows_read_a_sample_by_name_holding_a_few_row_groups(tmp_path):
    """store.Rows: each sample as {name: array} read on lookup (the own-error run's fp64 reference):
    the same names, shapes and values as store.read, at most `keep` row groups decoded at once, and a
    lookup order that walks two regions of the file in order (leaf outputs, `pre:` inputs) reads
    each row group about once."""
    rng = np.random.default_rng(2)
    rows = [store.Tensor(k, n, i, rng.standard_normal((8, 16)))
            for k in range(2) for i, n in enumerate([f"l{j}" for j in range(6)] + [f"pre:l{j}" for j in range(6)])]
    rows.append(store.Tensor(1, "s", 99, np.float64(3.0)))  # rank 0
    with store.writer(tmp_path / "f.parquet", budget=2100) as w:  # 2 tensors a row group
        w.extend(rows)
    r = store.Rows(tmp_path / "f.parquet")
    samples = list(r.by_sample())
    assert [k for k, _ in samples] == [0, 1]
    for k, got in samples:
        want = {t.name: t.array for t in rows if t.sample == k}
        assert list(got) == list(want) and len(got) == len(want) and "nope" not in got
        assert all(got.shape(n) == np.shape(want[n]) == store.shape_in(got, n) for n in want)
        before = r.groups_read
        for j in range(6):  # interleaved: pre:lj then lj, as own.parquet's order reads them
            for n in (f"pre:l{j}", f"l{j}"):
                assert np.array_equal(got[n], want[n]) and got[n].dtype == want[n].dtype
                assert len(r.cache) <= r.keep
        assert r.groups_read - before <= 7
        assert got.get("nope") is None and np.array_equal(got.get("l0"), want["l0"])
    assert store.shape_in({"a": np.ones((2, 3))}, "a") == (2, 3)


def test_rows_whole_decode_a_small_file_once_and_a_large_one_two_groups_at_a_time(tmp_path, monkeypatch):
    """store.Rows(keep=WHOLE), the capture's fp64 reference reader: a file that fits store.KEEP_MB stays
    decoded, so a second pass over every sample reads no row group again; one that does not keeps
    the streaming bound (2 row groups). Same values either way."""
    rng = np.random.default_rng(3)
    rows = [store.Tensor(k, f"l{j}", j, rng.standard_normal((8, 16))) for k in range(2) for j in range(6)]
    with store.writer(tmp_path / "f.parquet", budget=2100) as w:  # a few tensors a row group
        w.extend(rows)
    groups = store.Rows(tmp_path / "f.parquet").file.num_row_groups
    assert groups > 2
    for keep_mb, keep, reads in ((1.0, groups, groups), (0.0001, 2, 2 * groups)):
        monkeypatch.setattr(store, "KEEP_MB", keep_mb)
        r = store.Rows(tmp_path / "f.parquet", keep=store.Rows.WHOLE)  # KEEP_MB: no bound given
        assert r.keep == keep
        for _ in range(2):  # two passes, as the oracle's sums and the own-error run
            for k, got in r.by_sample():
                assert all(np.array_equal(got[t.name], t.array) for t in rows if t.sample == k)
        assert r.groups_read == reads


def test_a_leaf_input_equal_to_another_leaf_output_is_stored_once_and_resolves(tmp_path):
    """store.stored_once: a `pre:` input byte for byte another row of the sample is written as a
    reference to it (no values of its own) and reads back as that row's values, through store.read,
    store.read_dict and store.Rows (issue 23: the fp64 reference)."""
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    z = y.copy()
    z.flat[7] = -0.0 if y.flat[7] == 0 else np.nextafter(y.flat[7], 9)  # one bit off: not the same
    named = [("conv", x), ("relu", y), ("pre:conv", z), ("pre:relu", x.copy()), ("pre:fc", y[:, :, ::2])]
    rows = store.stored_once(store.rows_from(0, named) + store.rows_from(1, named))
    assert [t.same_as for t in rows if t.sample == 0] == [None, None, None, "conv", None]
    store.write(tmp_path / "f.parquet", rows)
    assert store.Rows(tmp_path / "f.parquet").same_as.count("conv") == 2
    back = store.read_dict(tmp_path / "f.parquet")
    for k in (0, 1):
        for n, v in named:
            assert store.same_bytes(back[(k, n)].array, np.ascontiguousarray(v)), (k, n)
    assert [t.name for t in store.read(tmp_path / "f.parquet")] == [t.name for t in rows]
    one = dict(store.Rows(tmp_path / "f.parquet").by_sample())[1]
    assert store.same_bytes(one["pre:relu"], x) and one.shape("pre:relu") == x.shape
    # stored once: the file is smaller than the same rows with every value written
    store.write(tmp_path / "all.parquet", [store.Tensor(t.sample, t.name, t.order, t.array) for t in rows])
    assert (tmp_path / "f.parquet").stat().st_size < (tmp_path / "all.parquet").stat().st_size


def test_rows_against_a_base_file_read_back_exactly_and_need_it(tmp_path):
    """A `base:` row is the base file's value cast to the row's dtype; an `xor:` row stores its bits
    XOR that cast (an own value near its fp64 reference). Both read back bit for bit; without the base
    file the read fails naming it."""
    from parity.core.io import Corrupt

    rng = np.random.default_rng(6)
    gold = {"a": rng.standard_normal((3, 5)), "pre:b": rng.standard_normal(7)}
    store.write(tmp_path / "ref/fp64.parquet", [store.Tensor(0, n, i, v) for i, (n, v) in enumerate(gold.items())])
    near = gold["a"].astype(np.float32)
    near.flat[::3] = np.nextafter(near.flat[::3], np.float32(np.inf))
    own = [store.Tensor(0, "between:b", 0, gold["pre:b"].astype(np.float32), "base:pre:b"),
           store.Tensor(0, "a", 1, store.xor_bits(near, gold["a"].astype(np.float32)), "xor:a"),
           store.Tensor(0, "h", 2, gold["pre:b"].astype(np.float16), "base:pre:b")]
    store.write(tmp_path / "cap/own.parquet", own, {"base": "../ref/fp64.parquet"})
    back = store.read_dict(tmp_path / "cap/own.parquet")
    assert store.same_bytes(back[(0, "between:b")].array, gold["pre:b"].astype(np.float32))
    assert store.same_bytes(back[(0, "a")].array, near)
    assert store.same_bytes(back[(0, "h")].array, gold["pre:b"].astype(np.float16))
    (tmp_path / "ref/fp64.parquet").unlink()
    with pytest.raises(Corrupt, match="fp64.parquet"):
        store.read_dict(tmp_path / "cap/own.parquet")
