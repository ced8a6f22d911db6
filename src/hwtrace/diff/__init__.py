"""``hwtrace diff``: where two recorded executions parted ways.

The pieces, in the order the data flows (:func:`.runs.diff_runs` drives
them; ``cli/diff.py`` prints what it yields):

* :mod:`.threads` -- the threads of each recording and which goes with
  which (process tree, creation order, ``--thread``);
  :mod:`.cpusplit` gives each thread its segments of a CPU stream
  that interleaves several, :mod:`.cpumerge` joins a thread that moved
  between CPUs;
* :mod:`.symtab` -- a process's modules and functions, for whole arrays
  of addresses; :mod:`.relocate` -- B's addresses in A's terms (same
  file elsewhere: by module offset; another build: by symbol+offset);
* :mod:`.steps` -- a thread's batches as steps (straight runs ending at a
  branch), the unit compared; :mod:`.stack` -- the call stack kept a
  chunk at a time;
* :mod:`.align` -- the first difference, and where the runs are in step
  again;
* :mod:`.coverage` (with :mod:`.counting`) -- what each run executed and
  what only one did;
* :mod:`.records` (with :mod:`.disasm`) -- a divergence as a dict:
  functions, lines, instructions, the deciding branch; :mod:`.text` --
  the readable rendering.

No I/O outside what :mod:`hwtrace.streams` opens and the ELF files the
symbols come from.
"""
