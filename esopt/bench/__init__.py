"""Benchmarks: speed, memory and ES-vs-RL comparisons (`esopt bench overhead | rollout | horizon`)."""
