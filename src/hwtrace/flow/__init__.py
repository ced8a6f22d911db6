"""Instruction-flow decoding: memory images and the query/insn/block
decoders that turn Intel PT packets plus code into executed instructions.

Modules: :mod:`.image` (sections and images), :mod:`.loaders` (raw, ELF,
page dumps), :mod:`.query` (the event/query layer over packets),
:mod:`.insn` and :mod:`.block` (instruction and block decoders).
"""
