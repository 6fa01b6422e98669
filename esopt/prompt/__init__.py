"""Prompt-space optimisation: reflectors that turn trajectories into text (skills, prompts)."""
