"""Pure broker cores wired in memory: the fabric the core's tests use and the scale simulator."""
