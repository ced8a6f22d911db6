"""Instruction listings from decoded batches (``hwtrace decode``).

A listing prints every instruction of a stream, so it is built to cost
little per instruction: each address is formatted once per address space
and mode, and every occurrence after that is an index into a cache,
joined with the others in bulk (numpy gathers and ``bytes.join``; no
Python object per instruction).

* :mod:`.cache` -- :class:`~.cache.LineCache`, address -> text for whole
  arrays of addresses (a vectorized hash table);
* :mod:`.walk` -- :class:`~.walk.Walker`, batches -> output, events and
  errors at their places, address-space switches followed;
* :mod:`.text`, :mod:`.jsonl` -- the two formats (ptxed's text and the
  symbolized, disassembled listing; ptoracle's JSON lines);
* :mod:`.annotate` -- function+offset, disassembly and source line of an
  instruction (symbols through :mod:`hwtrace.analysis.symbols`);
* :mod:`.disasm` -- x86 disassembly through capstone;
* :mod:`.contexts` -- one cache per address space;
* :mod:`.single` -- the same annotations one instruction at a time, for
  the session sinks the parallel decoder drives.

No I/O here beyond reading the ELF files of the images; the CLI passes
a ``write(bytes)`` callable.
"""
