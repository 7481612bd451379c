"""`amplint compare`: an FP32 baseline against AMP trials on a fixed dataset, then the gains.

The method is the founding guide's (SEED.md §1, §4, §7): fix the dataset and the pass criteria,
check the FP32 baseline itself, compare scores with an explicit tolerance, then decisions, reject
non-finite outputs, check quality, and only for trials that pass measure time and memory without
diagnostics. Modules:

- ``spec``     loads and validates the spec file (names ``model``, ``cases``, ``decide``, ...)
- ``criteria`` the pass criteria: validation, defaults, and which ones a trial failed
- ``outputs``  model outputs as named leaves, default decision and margin, hashing
- ``run``      the baseline and the trials; builds the JSON-shaped report
- ``gains``    time and peak memory, measured in a separate pass without diagnostic reads
- ``store``    ``--save-baseline`` / ``--baseline`` files
- ``report``   the terminal tables and the JSON file
- ``command``  the thin click command

Nothing in this package is imported by ``amplint.cli`` until ``amplint compare`` runs, and torch is
imported inside the modules that need it.
"""
