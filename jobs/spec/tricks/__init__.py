"""The memory tricks, one module each; `registry` lists them and is what the rest of tunedeck reads.

Each trick's module holds everything about it: the spec fields it owns, its one-line trade-off, its mapping to
trl/transformers/peft arguments, what refuses it (device, packages, combinations), its step in the sweep and
the out-of-memory ladder, its place in presets and Fit to GPU, and its part of (or note on) the memory
prediction. Adding a trick: a module here, its record in `registry.TRICKS`, tests, a row in docs/memory.md.

This file imports nothing, so a trick module can import `jobs.spec.tricks.record` without a cycle.
"""
