"""pacer-hf evaluation harness: benchmarks that measure, never assert (run from the repository root)."""
