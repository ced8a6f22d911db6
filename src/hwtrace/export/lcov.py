"""Line coverage in lcov's tracefile format (``geninfo(1)``: SF, FN, FNDA,
FNF, FNH, DA, LF, LH, end_of_record), from basic-block counts and the
DWARF line tables of the images.

A line's count is the execution count of its most executed instruction
(an instruction's count is the sum of the counts of the blocks holding it); every line of the compilation units that ran is listed (``DA:n,0`` when
not executed), so viewers (genhtml, IDE gutters) show what did not run;
source files where nothing ran are left out.  Line tables are read only
for the compilation units holding executed code (``.debug_aranges``).  A
function's count is the count of blocks starting at its entry.
"""

from __future__ import annotations

import bisect


def exec_intervals(blocks: dict[tuple[int, int], int]):
    """Cut points and counts: instructions in ``[points[i], points[i+1])``
    ran ``counts[i]`` times (the sum over the blocks containing them; block
    boundaries are instruction boundaries, so this is exact)."""
    diff: dict[int, int] = {}
    for (start, size), c in blocks.items():
        diff[start] = diff.get(start, 0) + c
        diff[start + size] = diff.get(start + size, 0) - c
    points = sorted(diff)
    counts = []
    run = 0
    for p in points:
        run += diff[p]
        counts.append(run)
    return points, counts


def line_counts(blocks: dict[tuple[int, int], int], symbolizer):
    """{file: {line: count}} and {file: {name: (line, count)}}."""
    lines: dict[str, dict[int, int]] = {}
    funcs: dict[str, dict[str, tuple[int, int]]] = {}
    entry_counts: dict[int, int] = {}
    for (start, _size), c in blocks.items():
        entry_counts[start] = entry_counts.get(start, 0) + c
    points, counts = exec_intervals(blocks)
    for img in symbolizer.images:
        mine = [s for (s, _z) in blocks if img.contains(s)]
        if not mine:
            continue
        rows = [r for r in img.line_rows(mine) if r[3] > 0]
        for a, e, f, ln in rows:
            d = lines.setdefault(f, {})
            if ln not in d:
                d[ln] = 0
            # intervals overlapping [a, e)
            i = max(bisect.bisect_right(points, a) - 1, 0)
            best = 0
            while i < len(points) and points[i] < e:
                if counts[i] > best and (i + 1 == len(points) or points[i + 1] > a):
                    best = counts[i]
                i += 1
            if best > d[ln]:
                d[ln] = best
        for fstart, _fsize, name in img.functions():
            loc = img.line(fstart, load=False)
            if loc is None:
                continue
            f, ln = loc
            if ln <= 0:
                continue
            if f in lines:
                funcs.setdefault(f, {})[name] = (ln, entry_counts.get(fstart, 0))
    # only source files where something ran (a libc with debug info would
    # otherwise list thousands of untouched files)
    for f in [f for f, d in lines.items() if not any(d.values())]:
        del lines[f]
        funcs.pop(f, None)
    return lines, funcs


def write_lcov(fp, blocks, symbolizer, test_name: str = "hwtrace") -> dict:
    """Write the tracefile (text); returns {file: (lines found, hit)}."""
    return write_lcov_parts(fp, [(blocks, symbolizer)], test_name)


def write_lcov_parts(fp, parts, test_name: str = "hwtrace") -> dict:
    """:func:`write_lcov` of the blocks of several address spaces, each
    with its own symbols (``parts``: (blocks, symbolizer) per space):
    a source line's (and function's) counts are added up."""
    lines: dict[str, dict[int, int]] = {}
    funcs: dict[str, dict[str, tuple[int, int]]] = {}
    for blocks, symbolizer in parts:
        ls, fs = line_counts(blocks, symbolizer)
        for f, d in ls.items():
            to = lines.setdefault(f, {})
            for ln, c in d.items():
                to[ln] = to.get(ln, 0) + c
        for f, d in fs.items():
            to = funcs.setdefault(f, {})
            for name, (ln, c) in d.items():
                had = to.get(name)
                to[name] = (ln, c + (had[1] if had else 0))
    result = {}
    fp.write(f"TN:{test_name}\n")
    for f in sorted(lines):
        fp.write(f"SF:{f}\n")
        fs = funcs.get(f, {})
        for name, (ln, _c) in sorted(fs.items(), key=lambda x: x[1][0]):
            fp.write(f"FN:{ln},{name}\n")
        for name, (_ln, c) in sorted(fs.items(), key=lambda x: x[1][0]):
            fp.write(f"FNDA:{c},{name}\n")
        fp.write(f"FNF:{len(fs)}\nFNH:{sum(1 for v in fs.values() if v[1])}\n")
        d = lines[f]
        for ln in sorted(d):
            fp.write(f"DA:{ln},{d[ln]}\n")
        hit = sum(1 for v in d.values() if v)
        fp.write(f"LF:{len(d)}\nLH:{hit}\nend_of_record\n")
        result[f] = (len(d), hit)
    return result
