"""fedsim plug-ins written outside fedsim, as a research group would: FedExP
(an algorithm), fastest-k selection (a selector) and a small MLP (a model).

Each class derives from a base in :mod:`fedsim.api`; ``tests`` of this package
would call :func:`fedsim.testing.check_algorithm` and ``check_selector``
(fedsim's tests/test_plugins.py does).
"""
