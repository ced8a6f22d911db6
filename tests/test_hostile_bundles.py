"""Hostile bundles and trace directories: a bundle from someone else can't
make hwtrace write outside its output directory, read files outside the
bundle unless the user allows it, hang on a planted FIFO, or allocate
memory out of proportion to the files (every size is checked against the
data).

Regression tests named ``test_regression_*`` each pin one finding of the
fuzzing/hostile-input work (issue 9).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import run_hwtrace
from hwtrace.bundle import (Bundle, BundleError, BundleWriter, Mmap, SidebandWriter,
                            iter_sideband_file)

SECRET = b"outside the bundle: must not be read\n"


def _manifest(d: Path, **kw) -> None:
    m = {"format": "hwtrace-bundle", "version": 1, "mode": "cpu"}
    m.update(kw)
    (d / "manifest.json").write_text(json.dumps(m))


@pytest.fixture
def outside(tmp_path):
    o = tmp_path / "outside"
    o.mkdir()
    (o / "secret").write_bytes(SECRET)
    return o


@pytest.fixture
def bdir(tmp_path):
    d = tmp_path / "bundle"
    d.mkdir()
    return d


# -- names --------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../outside/secret", "/etc/passwd", "a/../../x",
                                  "images/../../x", ".hidden", "x\0y", "", "sub/dir/f",
                                  "images/a/b", 7, None, "a" * 300])
def test_unsafe_stream_names_are_refused(bdir, name):
    _manifest(bdir, streams=[{"file": name, "cpu": 0, "size": 0}])
    with pytest.raises(BundleError, match="file name|duplicate"):
        Bundle(bdir)


@pytest.mark.parametrize("name", ["../x", "/abs", "images/../../x", "other/x"])
def test_unsafe_image_and_sideband_names_are_refused(bdir, name):
    _manifest(bdir, images=[{"file": name, "path": "/bin/true"}])
    with pytest.raises(BundleError, match="unsafe file name"):
        Bundle(bdir)
    _manifest(bdir, sideband=name)
    with pytest.raises(BundleError, match="unsafe file name"):
        Bundle(bdir)


# -- links and special files out of the bundle ---------------------------------

def test_stream_symlink_out_of_the_bundle_is_not_read(bdir, outside):
    os.symlink(outside / "secret", bdir / "cpu0.pt")
    _manifest(bdir, streams=[{"file": "cpu0.pt", "cpu": 0, "size": len(SECRET)}])
    b = Bundle(bdir)
    with pytest.raises(BundleError, match="symbolic link"):
        b.read_stream(b.streams[0])
    with pytest.raises(BundleError):
        b.open_stream(b.streams[0])


def test_manifest_symlink_is_not_followed(bdir, outside):
    (outside / "m.json").write_text(json.dumps({"format": "hwtrace-bundle", "version": 1}))
    os.symlink(outside / "m.json", bdir / "manifest.json")
    with pytest.raises(BundleError, match="cannot open"):
        Bundle(bdir)


def test_sideband_symlink_is_refused(bdir, outside):
    os.symlink(outside / "secret", bdir / "sideband.jsonl")
    _manifest(bdir)
    with pytest.raises(BundleError, match="sideband: not a regular file"):
        list(Bundle(bdir).iter_sideband())


def test_images_dir_symlinked_out_is_not_used(bdir, outside):
    os.symlink(outside, bdir / "images")
    _manifest(bdir, images=[{"file": "images/secret", "path": "/bin/x", "build_id": "b1"}])
    b = Bundle(bdir)
    assert b.find_image("/bin/x", "b1") is None


def test_find_image_reads_outside_only_when_allowed(bdir, outside, tmp_path):
    _manifest(bdir)
    target = str(outside / "secret")
    assert Bundle(bdir).find_image(target) is None
    assert Bundle(bdir, allow_outside=True).find_image(target) == Path(target)
    # --image-path: by base name, only in the directories the user named
    assert Bundle(bdir, image_path=[outside]).find_image("/some/where/secret") == \
        outside / "secret"
    assert Bundle(bdir, image_path=[tmp_path]).find_image("/x/../outside/secret") is None


@pytest.mark.parametrize("where", ["manifest", "stream", "open_stream"])
def test_regression_fifo_in_bundle_does_not_hang(bdir, where):
    """Finding: a FIFO named manifest.json or as a 0-byte stream blocked
    open() forever (no writer). Now: BundleError at once."""
    if where == "manifest":
        os.mkfifo(bdir / "manifest.json")
        with pytest.raises(BundleError, match="not a regular file"):
            Bundle(bdir)
        return
    os.mkfifo(bdir / "cpu0.pt")
    _manifest(bdir, streams=[{"file": "cpu0.pt", "cpu": 0, "size": 0}])
    b = Bundle(bdir)
    with pytest.raises(BundleError, match="not a regular file"):
        if where == "stream":
            b.read_stream(b.streams[0])
        else:
            b.open_stream(b.streams[0])


# -- sizes checked against the data ------------------------------------------

def test_huge_sizes_in_the_manifest_allocate_nothing(bdir):
    """A manifest claiming 1 TiB for a 3-byte stream: an error before any
    allocation (checked under a 256 MiB address-space cap in a child)."""
    (bdir / "cpu0.pt").write_bytes(b"\x02\x82\x02")
    _manifest(bdir, streams=[{"file": "cpu0.pt", "cpu": 0, "size": 1 << 40,
                              "capture_end": 1 << 40, "lost_bytes": (1 << 64) - 1}])
    code = f"""
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (768 << 20, resource.RLIM_INFINITY))
from hwtrace.bundle import Bundle, BundleError
b = Bundle({str(bdir)!r})
for f in (b.read_stream, b.open_stream):
    try:
        f(b.streams[0]); print("read")
    except BundleError as e:
        print("refused:", e)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        "refused: stream cpu0.pt: 3 bytes, manifest says 1099511627776",
        "refused: stream cpu0.pt: 3 bytes, manifest says 1099511627776"]


@pytest.mark.parametrize("field,value", [("size", -1), ("size", 1 << 64), ("size", "3"),
                                         ("cpu", 1 << 40), ("lost_bytes", 1.5),
                                         ("wrapped", 1)])
def test_bad_numbers_are_refused(bdir, field, value):
    s = {"file": "cpu0.pt", "cpu": 0, "size": 0}
    s[field] = value
    _manifest(bdir, streams=[s])
    with pytest.raises(BundleError):
        Bundle(bdir)


def test_too_many_streams_and_huge_json_are_refused(bdir):
    _manifest(bdir, streams=[{"file": f"c{i}.pt", "cpu": i} for i in range(70000)])
    with pytest.raises(BundleError, match="streams must be a list"):
        Bundle(bdir)
    (bdir / "manifest.json").write_bytes(b"[" * 100000 + b"]" * 100000)
    with pytest.raises(BundleError, match="manifest"):
        Bundle(bdir)
    with open(bdir / "manifest.json", "wb") as f:
        f.truncate((16 << 20) + 1)
    with pytest.raises(BundleError, match="larger than"):
        Bundle(bdir)


def test_sideband_long_line_and_deep_json(bdir):
    _manifest(bdir)
    (bdir / "sideband.jsonl").write_bytes(b'{"type":"exit","pid":1,"tid":1,"x":"'
                                          + b"a" * 70000 + b'"}\n')
    with pytest.raises(BundleError, match="line too long"):
        list(Bundle(bdir).iter_sideband())
    (bdir / "sideband.jsonl").write_bytes(b"[" * 60000 + b"\n")
    with pytest.raises(BundleError, match="bad JSON"):
        list(Bundle(bdir).iter_sideband())
    (bdir / "sideband.jsonl").write_bytes(b'{"type":"mmap","pid":1,"start":1,"size":1,'
                                          b'"offset":0,"file":7}\n')
    with pytest.raises(BundleError, match="not a string"):
        list(Bundle(bdir).iter_sideband())


# -- writing never leaves the output directory -------------------------------

def test_regression_writer_does_not_write_through_planted_links(tmp_path, outside):
    """Finding: BundleWriter opened stream files, manifest.json.tmp and the
    images/ directory through existing symbolic links, so a trace directory
    recovered in place (or a reused output directory) with planted links
    overwrote files outside it. Now the links are replaced, never followed."""
    out = tmp_path / "out"
    out.mkdir()
    for name in ("cpu0.pt", "manifest.json.tmp", "manifest.json"):
        os.symlink(outside / "secret", out / name)
    os.symlink(outside, out / "images")
    src = tmp_path / "prog"
    src.write_bytes(b"\x90\xc3")
    with BundleWriter(out, exist_ok=True, engine="t") as w:
        w.add_stream(b"\x02\x82" * 8, cpu=0)
        name = w.add_image(src, path="/bin/prog")
    assert (outside / "secret").read_bytes() == SECRET
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    for n in ("cpu0.pt", "manifest.json", name):
        assert not (out / n).is_symlink()
    assert not (out / "images").is_symlink()
    b = Bundle(out)
    assert b.read_stream(b.streams[0]) == b"\x02\x82" * 8
    assert b.find_image("/bin/prog") == out / name


def test_regression_sideband_writer_refuses_links_and_fifos(tmp_path, outside):
    os.symlink(outside / "new-file", tmp_path / "sideband.jsonl")
    with pytest.raises(BundleError, match="cannot append"):
        SidebandWriter(tmp_path / "sideband.jsonl")
    assert not (outside / "new-file").exists()
    os.unlink(tmp_path / "sideband.jsonl")
    os.mkfifo(tmp_path / "sideband.jsonl")
    # no reader: opening for writing without blocking fails (ENXIO)
    with pytest.raises(BundleError, match="cannot append: No such device"):
        SidebandWriter(tmp_path / "sideband.jsonl")
    w = SidebandWriter(tmp_path / "sideband.jsonl", append=False)   # replaces it
    w.add(Mmap(pid=1, start=1, size=2, offset=0, file="/x"))
    w.close()
    assert list(iter_sideband_file(tmp_path / "sideband.jsonl")) == [
        Mmap(pid=1, start=1, size=2, offset=0, file="/x")]


# -- recover over a hostile trace directory ----------------------------------

def test_regression_recover_ignores_planted_sideband_link(tmp_path, outside):
    """Finding: recover read a trace directory's sideband.jsonl through a
    symbolic link (a file outside the directory). Now it is not read and
    in-place recovery refuses to append through it."""
    t = tmp_path / "trace"
    t.mkdir()
    (t / "device.json").write_text(json.dumps({"engine": "emulated", "mode": "cpu"}))
    (outside / "sb.jsonl").write_text(
        '{"type":"process","pid":4242,"cr3":1,"comm":"leak"}\n')
    os.symlink(outside / "sb.jsonl", t / "sideband.jsonl")
    out = tmp_path / "out"
    r = run_hwtrace("recover", str(t), "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("recovered 0 stream(s)")
    assert "4242" not in (out / "sideband.jsonl").read_text()
    r = run_hwtrace("recover", str(t))            # in place
    assert r.returncode == 2
    assert r.stderr.startswith("hwtrace: recover: sideband.jsonl: cannot append")
    assert "Traceback" not in r.stderr
    assert (outside / "sb.jsonl").read_text().count("\n") == 1


def test_regression_recover_does_not_hang_on_fifo_config(tmp_path):
    """Finding: a FIFO as buf-N/config.json (or data/regs) blocked recover
    forever; now that buffer is skipped as damaged."""
    t = tmp_path / "trace"
    (t / "buf-0").mkdir(parents=True)
    (t / "device.json").write_text(json.dumps({"engine": "emulated", "mode": "cpu"}))
    os.mkfifo(t / "buf-0" / "config.json")
    r = run_hwtrace("recover", str(t), "-o", str(tmp_path / "out"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("recovered 0 stream(s)")


def test_recover_writes_only_inside_its_output(tmp_path, outside):
    t = tmp_path / "trace"
    t.mkdir()
    (t / "device.json").write_text(json.dumps({"engine": "emulated", "mode": "cpu"}))
    os.symlink(outside / "secret", t / "manifest.json.tmp")
    r = run_hwtrace("recover", str(t))
    assert r.returncode == 0, r.stderr
    assert (outside / "secret").read_bytes() == SECRET
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert Bundle(t).streams == ()


# -- import: the output directory ---------------------------------------------

def test_import_writes_only_inside_its_output(tmp_path, outside, hardware):
    pd = hardware / "perf_data_converter" / "perf.data.intel_pt-4.14"
    out = tmp_path / "out"
    out.mkdir()
    for n in ("cpu0.pt", "cpu1.pt", "cpu2.pt", "cpu3.pt", "sideband.jsonl",
              "manifest.json.tmp"):
        os.symlink(outside / "secret", out / n)
    r = run_hwtrace("import", str(pd), "-o", str(out), "--force")
    assert r.returncode == 0, r.stderr
    assert (outside / "secret").read_bytes() == SECRET
    b = Bundle(out)
    assert b.streams and all(not (out / s.file).is_symlink() for s in b.streams)
    for s in b.streams:
        assert len(b.read_stream(s)) == s.size


# -- commands that read bundles: outside files only when allowed ---------------

def _maps_outside(bdir, outside):
    """A one-stream bundle whose process maps ``outside``/secret."""
    (bdir / "cpu0.pt").write_bytes(b"\x02\x82" * 8 + b"\x02\x23")
    _manifest(bdir, streams=[{"file": "cpu0.pt", "cpu": 0, "size": 18}])
    (bdir / "sideband.jsonl").write_text(
        '{"type":"process","pid":1,"cr3":4096}\n'
        '{"type":"mmap","pid":1,"start":4194304,"size":4096,"offset":0,'
        f'"file":"{outside / "secret"}"}}\n')


def test_images_cli_does_not_resolve_outside_paths_unasked(bdir, outside):
    _maps_outside(bdir, outside)
    r = run_hwtrace("images", bdir, "--pt", "cpu0.pt")
    assert str(outside / "secret") not in r.stdout
    # allowed explicitly by the user: found by base name
    r = run_hwtrace("images", bdir, "--pt", "cpu0.pt", "--image-path", outside)
    assert r.returncode == 0 and str(outside / "secret") in r.stdout


def test_regression_import_copies_only_elf_files_from_this_machine(tmp_path, outside):
    """Finding: ``hwtrace import`` copied any existing file a perf.data MMAP
    record named (no build-id recorded) into the bundle, so a foreign
    perf.data could pull e.g. /etc/shadow into a bundle one then shares.
    Now only regular ELF files are taken from the recorded paths."""
    from hwtrace.engines.perf.importer import _resolve_images
    os.mkfifo(outside / "fifo")
    maps = [Mmap(pid=1, start=0x400000, size=4096, offset=0, file=str(outside / "secret")),
            Mmap(pid=1, start=0x500000, size=4096, offset=0, file=str(outside / "fifo")),
            Mmap(pid=1, start=0x600000, size=4096, offset=0, file=sys.executable)]
    found, missing = _resolve_images(maps, [])
    assert missing == [str(outside / "secret"), str(outside / "fifo")]
    assert found == {sys.executable: (Path(sys.executable), "")}
    # a file the user names with --image is used whatever it is
    found, missing = _resolve_images(maps[:1], [outside / "secret"])
    assert found == {str(outside / "secret"): (outside / "secret", "")} and missing == []


def test_regression_import_time_conversion_stays_u64(tmp_path):
    """Finding (fuzz perfimport f6e3d6dc4ef5): a mutated TIME_CONV made
    perf_time_to_tsc return 53824928838476487818 (> 2**64), so ``hwtrace
    import`` wrote a sideband its own bundle reader refused ("time is not an
    integer"). Times are now u64, as in perf."""
    from hwtrace.engines.perf.records import TimeConv
    tc = TimeConv(time_shift=40, time_mult=1, time_zero=0)
    assert tc.perf_time_to_tsc((1 << 64) - 1) == ((((1 << 64) - 1) << 40) & ((1 << 64) - 1))
    assert TimeConv(time_shift=65535, time_mult=3, time_zero=0).perf_time_to_tsc(7) == (
        ((7 << 64) // 3) & ((1 << 64) - 1))
    # the real perf conversion is unchanged for sane parameters
    tc = TimeConv(time_shift=31, time_mult=581029125, time_zero=18444502336406842448)
    t = tc.perf_time_to_tsc(tc.tsc_to_perf_time(123456789012))
    assert abs(t - 123456789012) <= 4


# -- hwtrace decode DIR (reads the bundle through hwtrace.bundle.Bundle) -------


def test_decode_dir_non_object_manifest_is_one_line(bdir):
    (bdir / "manifest.json").write_text("[1]")
    r = run_hwtrace("decode", bdir)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_decode_dir_fifo_manifest_does_not_hang(bdir):
    os.mkfifo(bdir / "manifest.json")
    try:
        r = run_hwtrace("decode", bdir, timeout=8)
    except subprocess.TimeoutExpired:
        raise AssertionError("decode blocked on a FIFO manifest") from None
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_decode_dir_refuses_stream_symlinked_out(bdir, outside):
    os.symlink(outside / "secret", bdir / "cpu0.pt")
    _manifest(bdir, streams=[{"file": "cpu0.pt", "cpu": 0, "size": len(SECRET)}])
    r = run_hwtrace("decode", bdir)
    assert r.returncode == 2 and "symbolic link" in r.stderr


def test_find_image_outside_needs_elf_with_recorded_build_id(bdir, outside):
    """Without --image-path / allow_outside, a recorded absolute path is used
    only if it is a regular ELF file whose build-id is the recorded one (what
    ``hwtrace record`` writes on this machine); anything else is refused."""
    from hwtrace.buildid import build_id
    _manifest(bdir)
    exe = os.path.realpath(sys.executable)
    bid = build_id(exe)
    assert bid                          # Debian's python3 carries a GNU build-id
    b = Bundle(bdir)
    assert b.find_image(exe, bid) == Path(exe)
    assert b.find_image(exe, bid.upper()) == Path(exe)
    assert b.find_image(exe, "00" * 20) is None
    assert b.find_image(exe) is None
    assert b.find_image(str(outside / "secret")) is None
    assert b.find_image(str(outside / "secret"), bid) is None
    os.mkfifo(outside / "fifo")         # must neither hang nor be used
    assert b.find_image(str(outside / "fifo")) is None
    # an ELF linked without a build-id matches a record without one
    (outside / "nobid").write_bytes(b"\x7fELF\x02\x01\x01" + bytes(57))
    assert b.find_image(str(outside / "nobid")) == outside / "nobid"
    assert b.find_image(str(outside / "nobid"), bid) is None


def test_images_cli_allow_outside_is_an_explicit_opt_in(bdir, outside):
    _maps_outside(bdir, outside)
    r = run_hwtrace("images", bdir, "--pt", "cpu0.pt", "--lines")
    assert r.returncode == 0 and r.stdout == ""
    r = run_hwtrace("images", bdir, "--pt", "cpu0.pt", "--lines", "--allow-outside")
    assert r.returncode == 0 and r.stdout.splitlines() == [
        "--raw", f"{outside / 'secret'}:0x0-0x{len(SECRET):x}:0x400000"]
