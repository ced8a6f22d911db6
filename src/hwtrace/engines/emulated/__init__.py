"""Emulated Intel PT: real executions observed by QEMU or ptrace, turned
into the byte stream Intel PT hardware would have written."""
