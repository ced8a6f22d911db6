"""The trace bundle: round trip through writer and reader, and hostile bundles."""

from __future__ import annotations

import json
import os

import pytest

from hwtrace.bundle import (Bundle, BundleError, BundleWriter, Exit, Mmap, Process,
                            Switch, Thread, is_bundle)
from hwtrace.control.capabilities import FULL, CpuInfo
from hwtrace.control.config import BufferConfig
from hwtrace.control.ctl import Ctl, with_field

PSB = b"\x02\x82" * 8


def _write(path, **kw):
    cfg = BufferConfig(num_chunks=2, chunk_order=0,
                       ctl=with_field(Ctl.BRANCH_EN | Ctl.USER | Ctl.MTC_EN, "mtc_freq", 3))
    cpu = CpuInfo(family=6, model=0x4E, stepping=3, nom_freq=28,
                  cpuid_0x15_eax=2, cpuid_0x15_ebx=188, timebase="host TSC")
    with BundleWriter(path, engine="testing", mode="cpu", config=cfg,
                      capabilities=FULL, cpu=cpu, **kw) as w:
        w.add_stream(PSB + b"\x00" * 4, cpu=0, instructions_observed=7)
        w.add_stream([PSB, b"\x02\xf3"], cpu=1, instructions_observed=0, wrapped=True)
        w.sideband.add(Process(pid=10, cr3=0x1000, comm="prog", time=1))
        w.sideband.add(Thread(tid=11, pid=10, time=2, parent_tid=10))
        w.sideband.add(Mmap(pid=10, start=0x400000, size=0x1000, offset=0,
                            file="/bin/prog", build_id="abcd", time=3))
        w.sideband.add(Switch(cpu=0, time=4, prev_pid=-1, prev_tid=-1, next_pid=10, next_tid=11))
        w.sideband.add(Exit(pid=10, tid=10, time=5, status=0))
    return path


def test_round_trip(tmp_path):
    b = Bundle(_write(tmp_path / "b"))
    assert is_bundle(tmp_path / "b")
    assert b.mode == "cpu" and b.engine == "testing"
    assert [s.file for s in b.streams] == ["cpu0.pt", "cpu1.pt"]
    s0, s1 = b.streams
    assert (s0.cpu, s0.tid, s0.instructions_observed, s0.size) == (0, None, 7, 20)
    assert b.read_stream(s0) == PSB + b"\x00" * 4
    assert b.read_stream(s1) == PSB + b"\x02\xf3" and s1.wrapped
    assert b.stream(cpu=1) == s1
    assert b.capabilities == FULL
    assert b.config.num_chunks == 2
    c = b.cpu
    assert (c.family, c.model, c.stepping, c.nom_freq) == (6, 0x4E, 3, 28)
    assert b.manifest["mtc_freq"] == 3
    assert b.decoder_args() == ["--cpu", "6/78/3", "--mtc-freq", "3", "--nom-freq", "28",
                                "--cpuid-0x15.eax", "2", "--cpuid-0x15.ebx", "188"]
    sb = b.sideband()
    assert sb.processes == [Process(pid=10, cr3=0x1000, comm="prog", time=1)]
    assert sb.threads[0].parent_tid == 10
    assert sb.mmaps[0].build_id == "abcd"
    assert sb.switches[0].next_tid == 11 and sb.exits[0].time == 5
    assert sb.pid_of_cr3(0x1000) == 10 and sb.cr3_of(10) == [0x1000]


def test_thread_streams_and_images(tmp_path):
    exe = tmp_path / "prog"
    exe.write_bytes(b"\x7fELF-ish")
    with BundleWriter(tmp_path / "b", mode="thread") as w:
        w.add_stream(PSB, tid=1234, pid=1200)
        name = w.add_image(exe, build_id="beef")
    b = Bundle(tmp_path / "b")
    assert b.streams[0].file == "tid1234.pt" and b.streams[0].pid == 1200
    assert b.find_image("/elsewhere/prog", "beef") == tmp_path / "b" / name
    assert b.find_image(str(exe)) == tmp_path / "b" / name
    assert b.find_image("/nonexistent/other") is None


def test_images_outside_only_when_allowed(tmp_path):
    exe = tmp_path / "lib" / "libx.so"
    exe.parent.mkdir()
    exe.write_bytes(b"x")
    with BundleWriter(tmp_path / "b", mode="cpu") as w:
        w.add_stream(PSB, cpu=0)
    assert Bundle(tmp_path / "b").find_image(str(exe)) is None
    assert Bundle(tmp_path / "b", allow_outside=True).find_image(str(exe)) == exe
    assert Bundle(tmp_path / "b", image_path=[exe.parent]).find_image("/x/libx.so") == exe


def _hostile(tmp_path, mutate):
    p = _write(tmp_path / "b")
    m = json.loads((p / "manifest.json").read_text())
    mutate(m, p)
    (p / "manifest.json").write_text(json.dumps(m))
    return p


@pytest.mark.parametrize("name", ["../escape.pt", "/etc/passwd", "a/b.pt", "..", ".hidden",
                                  "images/../../x", "", 5, None])
def test_hostile_stream_names(tmp_path, name):
    def m(man, p):
        man["streams"][0]["file"] = name
    with pytest.raises(BundleError):
        Bundle(_hostile(tmp_path, m))


def test_symlinked_stream_is_refused(tmp_path):
    def m(man, p):
        os.remove(p / "cpu0.pt")
        os.symlink("/etc/passwd", p / "cpu0.pt")
    b = Bundle(_hostile(tmp_path, m))
    with pytest.raises(BundleError):
        b.read_stream(b.streams[0])


def test_size_mismatch_and_huge_sizes(tmp_path):
    def m(man, p):
        man["streams"][0]["size"] = 1 << 40
    b = Bundle(_hostile(tmp_path, m))
    with pytest.raises(BundleError, match="bytes"):
        b.read_stream(b.streams[0])


@pytest.mark.parametrize("mutate", [
    lambda m: m.update(format="other"),
    lambda m: m.update(version=99),
    lambda m: m.update(mode="both"),
    lambda m: m.update(streams={"a": 1}),
    lambda m: m["streams"][0].update(cpu=-1),
    lambda m: m["streams"][0].update(cpu=True),
    lambda m: m["streams"][0].update(tid=3),
    lambda m: m["streams"][0].update(instructions_observed="many"),
    lambda m: m["streams"].append(dict(m["streams"][0])),
    lambda m: m.update(nom_freq=-3),
    lambda m: m.update(images=[{"file": "../x"}]),
    lambda m: m.update(sideband="../../etc/passwd"),
])
def test_malformed_manifests(tmp_path, mutate):
    with pytest.raises(BundleError):
        Bundle(_hostile(tmp_path, lambda m, p: mutate(m)))


def test_manifest_not_json_or_missing(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(BundleError, match="not found"):
        Bundle(tmp_path / "x")
    (tmp_path / "x" / "manifest.json").write_text("[1,")
    with pytest.raises(BundleError, match="not JSON"):
        Bundle(tmp_path / "x")
    with pytest.raises(BundleError):
        Bundle(tmp_path / "nope")


@pytest.mark.parametrize("line", [
    b'{"type":"process","pid":"x","cr3":1}\n',
    b'{"type":"nuke"}\n',
    b'{"type":"mmap","pid":1}\n',
    b'[1,2]\n',
    b'{"type":"process",\n',
    b'{"type":"process","pid":1,"cr3":1,"comm":"' + b"a" * 70000 + b'"}\n',
])
def test_malformed_sideband(tmp_path, line):
    p = _write(tmp_path / "b")
    with open(p / "sideband.jsonl", "ab") as f:
        f.write(line)
    with pytest.raises(BundleError):
        Bundle(p).sideband()


def test_torn_last_sideband_line_is_skipped(tmp_path):
    p = _write(tmp_path / "b")
    with open(p / "sideband.jsonl", "ab") as f:
        f.write(b'{"type":"process","pid":9')
    assert len(Bundle(p).sideband().processes) == 1


def test_writer_refuses_existing_bundle_and_bad_streams(tmp_path):
    _write(tmp_path / "b")
    with pytest.raises(BundleError):
        BundleWriter(tmp_path / "b")
    with BundleWriter(tmp_path / "c") as w:
        with pytest.raises(ValueError):
            w.add_stream(b"", cpu=0, tid=1)
        with pytest.raises(BundleError):
            w.add_stream(b"", cpu=0, file="../x.pt")
        w.add_stream(b"", cpu=0)
        with pytest.raises(ValueError):
            w.add_stream(b"", cpu=0)


def test_open_stream(tmp_path):
    b = Bundle(_write(tmp_path / "b"))
    with b.open_stream(b.streams[0]) as f:
        assert f.read() == PSB + b"\x00" * 4
    with open(tmp_path / "b" / "cpu1.pt", "ab") as f:
        f.write(b"more")
    with pytest.raises(BundleError):
        b.open_stream("cpu1.pt")
    with pytest.raises(BundleError):
        b.open_stream("cpu9.pt")


from hypothesis import given, settings, strategies as st  # noqa: E402

json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) |
                           st.text(max_size=20),
                           lambda kids: st.lists(kids, max_size=4) |
                           st.dictionaries(st.text(max_size=10), kids, max_size=4),
                           max_leaves=12)


@pytest.fixture(scope="module")
def hostile_base(tmp_path_factory):
    p = _write(tmp_path_factory.mktemp("h") / "b")
    return p, (p / "manifest.json").read_text()


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(["streams", "config", "capabilities", "cpu", "images", "sideband",
                            "mode", "nom_freq", "mtc_freq", "version"]),
       value=json_values, field=st.sampled_from(["file", "cpu", "tid", "size", "pid",
                                                 "instructions_observed", "wrapped", "config"]))
def test_hostile_manifest_values_only_raise_bundle_error(hostile_base, key, value, field):
    p, text = hostile_base
    m = json.loads(text)
    m[key] = json.loads(json.dumps(value))
    if isinstance(m.get("streams"), list) and m["streams"] and isinstance(m["streams"][0], dict):
        m["streams"][0][field] = json.loads(json.dumps(value))
    (p / "manifest.json").write_text(json.dumps(m))
    try:
        b = Bundle(p)
        for s in b.streams:
            b.read_stream(s)
        b.config, b.capabilities, b.cpu, b.decoder_args(), b.sideband()
        b.find_image("/bin/sh")
    except BundleError:
        pass


# Bundle reads through hwtrace._pathstr (no pathlib import) and still hands
# out what it did
def test_reader_still_gives_paths(tmp_path):
    from pathlib import Path
    exe = tmp_path / "prog"
    exe.write_bytes(b"\x7fELF-ish")
    with BundleWriter(tmp_path / "b", mode="thread") as w:
        w.add_stream(PSB, tid=1234, pid=1200)
        name = w.add_image(exe, build_id="beef")
    given = f"{tmp_path}//./b/"
    b = Bundle(given, image_path=[f"{tmp_path}/./"])
    assert isinstance(b.path, Path) and b.path == Path(given)
    assert b.image_path == [Path(tmp_path)]
    p = b.stream_path(b.streams[0])
    assert isinstance(p, Path) and p == Path(given) / "tid1234.pt"
    assert b.stream_file(b.streams[0]) == str(p)
    img = b.find_image("/elsewhere/prog", "beef")
    assert isinstance(img, Path) and img == Path(given) / name
    assert b.image_file("/elsewhere/prog", "beef") == str(img)
    assert b.find_image("/x/prog") == Path(tmp_path) / "prog"
    assert is_bundle(given) and not is_bundle(tmp_path)
