"""A mutation check of the core: hand-written sabotages (a sign flipped, a margin ignored, a restore skipped, a
reply routed to the wrong request...) applied one at a time to a temporary copy of the repository; each must
make at least one of its tests fail. `python -m tests.mutation` (or `make mutation`); not part of `make test`.

The working tree is never modified: esopt/, tests/, configs/ and pyproject.toml are copied into a temp dir,
the copy's esopt is imported (PYTHONPATH), and a sabotage is applied there, tested, then undone.
"""
