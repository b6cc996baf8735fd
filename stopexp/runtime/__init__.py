"""Running a stage: tracking, sweeps, launchers, ranks, threads, the hub, atomic artifacts
and their integrity records, the command-line error report."""
