"""Analyses behind results/*.md: does ES learn, and why (`esopt analyze calibrate | neighbourhood | step |
variance | gain`)."""
