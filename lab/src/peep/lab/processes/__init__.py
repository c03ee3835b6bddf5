"""Real processes for the lab and the tests: the PKI, retained-message cleanup, ... (one place, shared by the
benchmarks, the soak, the demo and the tests)."""
