"""Stage 8 from Python: the native runtime located, loaded in-process, compared with eager."""
