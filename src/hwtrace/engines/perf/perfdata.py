"""perf.data reader: file and pipe layouts, bytes (or mmap) in, records out.

    pd = PerfData(data)            # bytes, bytearray, memoryview or mmap
    pd.layout                      # "file" or "pipe"
    pd.attrs                       # [(PerfEventAttr, ids)]
    pd.feature("CPUID")            # parsed feature, or None
    for rec in pd.records(): ...   # Record(offset, type, misc, size, body, sample_id)
    pd.aux_data(rec)               # memoryview of an AUXTRACE record's payload

Parsing is lazy: the constructor reads the file header (or, for a pipe,
nothing); records, attrs and features are decoded when asked for.  Every
size is checked against the data before it is used, and any malformation
raises :class:`PerfDataError` (with an offset) and nothing else.  A bare
stream of perf_event records without a header (e.g. a sideband dump) is
read with :func:`iter_records`.  No I/O here.
"""

from __future__ import annotations

import struct
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterator

from . import abi
from .errors import PerfDataError
from .features import parse_feature
from .records import Record, decode_body, parse_sample_id, sample_id_size

MAGIC = b"PERFILE2"
MAGIC_BE = b"2ELIFREP"
PIPE_HEADER_SIZE = 16
FILE_HEADER_SIZE = 104
_HDR = struct.Struct("<IHH")


@dataclass(frozen=True, slots=True)
class Section:
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class AttrIds:
    attr: abi.PerfEventAttr
    ids: tuple[int, ...]


class SampleLayouts:
    """Which attr (hence sample_type) a record belongs to.

    With one attr, or attrs that all lay samples out alike, that is the
    answer; otherwise the record's IDENTIFIER (first u64 of a SAMPLE, last
    u64 of a sample_id_all trailer) is looked up in the attrs' ids.
    """

    def __init__(self, attrs: list[AttrIds], default_sample_type: int | None = None,
                 sample_id_all: bool | None = None):
        self.attrs = list(attrs)
        self._by_id = {i: a.attr for a in self.attrs for i in a.ids}
        self._default_st = default_sample_type
        self._default_all = sample_id_all
        types = {(a.attr.sample_type, a.attr.flag("sample_id_all")) for a in self.attrs}
        self._uniform = len(types) <= 1
        self._ident = bool(self.attrs) and all(
            a.attr.sample_type & abi.SAMPLE_IDENTIFIER for a in self.attrs)

    def add(self, a: AttrIds) -> None:
        self.__init__(self.attrs + [a], self._default_st, self._default_all)

    def _fallback(self) -> tuple[int, bool]:
        if self.attrs:
            a = self.attrs[0].attr
            return a.sample_type, a.flag("sample_id_all")
        return self._default_st or 0, bool(self._default_all)

    def lookup(self, buf, offset: int, rtype: int, size: int) -> tuple[int, bool]:
        """(sample_type, has_trailer) for the record at ``offset``."""
        if self._uniform or not self._ident:
            return self._fallback()
        if rtype == abi.SAMPLE:
            pos = offset + 8
        else:
            pos = offset + size - 8
        if pos < offset + 8 or pos + 8 > offset + size:
            return self._fallback()
        attr = self._by_id.get(struct.unpack_from("<Q", buf, pos)[0])
        if attr is None:
            return self._fallback()
        return attr.sample_type, attr.flag("sample_id_all")


def _walk(buf, start: int, end: int) -> Iterator[tuple[int, int, int, int, int]]:
    """(offset, type, misc, size, extra) per record; extra = payload after it."""
    pos = start
    while pos < end:
        if pos + 8 > end:
            raise PerfDataError("truncated record header", pos)
        rtype, misc, size = _HDR.unpack_from(buf, pos)
        if size < 8:
            raise PerfDataError(f"record size {size} below header size", pos)
        if pos + size > end:
            raise PerfDataError(f"record of {size} bytes overruns the data", pos)
        extra = 0
        if rtype == abi.AUXTRACE:
            if size < 48:
                raise PerfDataError("AUXTRACE record too short", pos)
            extra = struct.unpack_from("<Q", buf, pos + 8)[0]
        elif rtype == abi.HEADER_TRACING_DATA:
            if size < 12:
                raise PerfDataError("TRACING_DATA record too short", pos)
            n = struct.unpack_from("<I", buf, pos + 8)[0]
            extra = (n + 7) & ~7
        if extra > end - pos - size:
            raise PerfDataError(f"payload of {extra} bytes overruns the data", pos)
        yield pos, rtype, misc, size, extra
        pos += size + extra


def _decode(buf, layouts: SampleLayouts, offset: int, rtype: int, misc: int,
            size: int) -> Record:
    body_end = offset + size
    sample_id = None
    st, has_trailer = layouts.lookup(buf, offset, rtype, size)
    if rtype < abi.HEADER_ATTR and rtype != abi.SAMPLE and has_trailer:
        n = sample_id_size(st)
        if n:
            if size - 8 < n:
                raise PerfDataError("record too short for its sample_id trailer", offset)
            body_end -= n
            sample_id = parse_sample_id(buf, body_end, st)
    body = decode_body(buf, offset, rtype, misc, size, body_end, st)
    return Record(offset, rtype, misc, size, body, sample_id)


def iter_records(buf, start: int = 0, end: int | None = None, *,
                 sample_type: int = 0, sample_id_all: bool = True,
                 attrs: list[AttrIds] | None = None) -> Iterator[Record]:
    """Decode a bare stream of records (no perf.data header)."""
    end = len(buf) if end is None else end
    layouts = SampleLayouts(attrs or [], sample_type, sample_id_all)
    for off, t, misc, size, _extra in _walk(buf, start, end):
        rec = _decode(buf, layouts, off, t, misc, size)
        if t == abi.HEADER_ATTR:
            layouts.add(AttrIds(rec.body.attr, rec.body.ids))
        yield rec


class PerfData:
    """A perf.data file (``layout == "file"``) or stream (``"pipe"``)."""

    def __init__(self, data):
        self._buf = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
        buf = self._buf
        if len(buf) < PIPE_HEADER_SIZE:
            raise PerfDataError("too short for a perf.data header", 0)
        magic = bytes(buf[:8])
        if magic == MAGIC_BE:
            raise PerfDataError("big-endian perf.data is not supported", 0)
        if magic != MAGIC:
            raise PerfDataError("not a perf.data file (bad magic)", 0)
        hsize = struct.unpack_from("<Q", buf, 8)[0]
        self._attrs: list[AttrIds] | None = None
        self._features: dict[int, Section] | None = None
        self._feature_cache: dict[int, Any] = {}
        if hsize == PIPE_HEADER_SIZE:
            self.layout = "pipe"
            self.data = Section(PIPE_HEADER_SIZE, len(buf) - PIPE_HEADER_SIZE)
            self.attr_size = 0
            self.feature_bits = 0
            return
        if hsize < FILE_HEADER_SIZE or len(buf) < FILE_HEADER_SIZE:
            raise PerfDataError(f"bad perf.data header size {hsize}", 8)
        self.layout = "file"
        (self.attr_size, ao, asz, do, dsz, eo, esz) = struct.unpack_from("<7Q", buf, 16)
        self.attrs_section = self._section(ao, asz, 24)
        self.data = self._section(do, dsz, 40)
        self.event_types = self._section(eo, esz, 56)
        bits = struct.unpack_from("<4Q", buf, 72)
        self.feature_bits = bits[0] | bits[1] << 64 | bits[2] << 128 | bits[3] << 192

    # -- header pieces --------------------------------------------------
    def _section(self, off: int, size: int, where: int) -> Section:
        if off > len(self._buf) or size > len(self._buf) - off:
            raise PerfDataError(f"section [{off:#x}, +{size:#x}) outside the file", where)
        return Section(off, size)

    @property
    def attrs(self) -> list[AttrIds]:
        if self._attrs is None:
            self._attrs = self._read_attrs()
        return self._attrs

    def _read_attrs(self) -> list[AttrIds]:
        buf = self._buf
        if self.layout == "pipe":
            out = []
            for off, t, misc, size, _x in _walk(buf, self.data.offset, len(buf)):
                if t == abi.HEADER_ATTR:
                    body = decode_body(buf, off, t, misc, size, off + size, 0)
                    out.append(AttrIds(body.attr, body.ids))
            return out
        a = self.attr_size
        if a < abi.ATTR_SIZE_VER0 + 16:
            raise PerfDataError(f"attr size {a} too small", 16)
        sec = self.attrs_section
        out = []
        for pos in range(sec.offset, sec.offset + sec.size - a + 1, a):
            asz = struct.unpack_from("<I", buf, pos + 4)[0] or abi.ATTR_SIZE_VER0
            attr = abi.PerfEventAttr.unpack(buf, pos, min(asz, a - 16))
            io, isz = struct.unpack_from("<QQ", buf, pos + a - 16)
            ids = self._section(io, isz, pos + a - 16)
            n = ids.size // 8
            out.append(AttrIds(attr, struct.unpack_from(f"<{n}Q", buf, ids.offset)))
        return out

    def _feature_sections(self) -> dict[int, Section]:
        if self._features is not None:
            return self._features
        buf = self._buf
        feats: dict[int, Section] = {}
        if self.layout == "pipe":
            for off, t, misc, size, _x in _walk(buf, self.data.offset, len(buf)):
                if t == abi.HEADER_FEATURE:
                    body = decode_body(buf, off, t, misc, size, off + size, 0)
                    feats[body.feat_id] = Section(body.data_offset, body.data_size)
        else:
            pos = self.data.offset + self.data.size
            for bit in range(256):
                if not self.feature_bits >> bit & 1:
                    continue
                if pos + 16 > len(buf):
                    raise PerfDataError("feature section table truncated", pos)
                fo, fsz = struct.unpack_from("<QQ", buf, pos)
                feats[bit] = self._section(fo, fsz, pos)
                pos += 16
        self._features = feats
        return feats

    def feature_names(self) -> list[str]:
        return [abi.FEAT_NAMES[i] if i < len(abi.FEAT_NAMES) else f"FEAT_{i}"
                for i in sorted(self._feature_sections())]

    def feature(self, name: str | int) -> Any:
        """The parsed feature (None when absent)."""
        if isinstance(name, int):
            fid = name
        elif name.startswith("FEAT_") and name[5:].isdigit():
            fid = int(name[5:])
        else:
            fid = abi.FEAT[name]
        sec = self._feature_sections().get(fid)
        if sec is None:
            return None
        if fid not in self._feature_cache:
            self._feature_cache[fid] = parse_feature(fid, self._buf, sec.offset,
                                                     sec.offset + sec.size)
        return self._feature_cache[fid]

    # -- records ----------------------------------------------------------
    def records(self, types: set[int] | frozenset[int] | None = None) -> Iterator[Record]:
        """Records of the data section in order (only ``types`` if given)."""
        buf = self._buf
        start, end = self.data.offset, self.data.offset + self.data.size
        if self.layout == "pipe":
            layouts = SampleLayouts([])
        else:
            layouts = SampleLayouts(self.attrs)
        for off, t, misc, size, _x in _walk(buf, start, end):
            if t == abi.HEADER_ATTR and self.layout == "pipe":
                rec = _decode(buf, layouts, off, t, misc, size)
                layouts.add(AttrIds(rec.body.attr, rec.body.ids))
                if types is None or t in types:
                    yield rec
                continue
            if types is not None and t not in types:
                continue
            yield _decode(buf, layouts, off, t, misc, size)

    def record_counts(self) -> Counter:
        """Records per type name, from headers only."""
        return Counter(abi.RECORD_NAMES.get(t, f"UNKNOWN_{t}") for _o, t, _m, _s, _x
                       in _walk(self._buf, self.data.offset,
                                self.data.offset + self.data.size))

    def aux_data(self, rec: Record) -> memoryview:
        """The PT bytes following an AUXTRACE record."""
        b = rec.body
        if rec.type != abi.AUXTRACE:
            raise PerfDataError("not an AUXTRACE record", rec.offset)
        if b.data_offset + b.size > len(self._buf):
            raise PerfDataError("AUXTRACE payload overruns the data", rec.offset)
        return self._buf[b.data_offset:b.data_offset + b.size]

    def build_ids(self) -> dict[str, bytes]:
        """filename -> build-id, from the feature and HEADER_BUILD_ID records."""
        out = {b.filename: b.build_id for b in (self.feature("BUILD_ID") or ())}
        if self.layout == "pipe":
            for rec in self.records({abi.HEADER_BUILD_ID}):
                out[rec.body.filename] = rec.body.build_id
        return out
