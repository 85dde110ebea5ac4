"""Phase 11: tuned configs per GPU and dtype, kept in tables shipped with the library, looked up before any tuning, and checked for the A100 by compiling for sm_80."""
