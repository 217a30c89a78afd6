"""The commands wing: ``fedsim run | validate | compare | stress | report``
and what only they need (pre-flight checks, paired statistics, trackers,
figures and reports).

Nothing outside this package imports it (tests/test_imports.py): the core
and the Ray layer run, and are tested, without any command.
"""
