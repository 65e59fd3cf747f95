"""Did the run get better? Benchmark tasks scored on a run and on its base (`harness`), with lm-evaluation-harness."""
