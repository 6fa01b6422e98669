"""Benchmarks and analyses that compare ES with the GRPO and PPO baselines (`esopt bench horizon`,
`esopt analyze variance`)."""
