"""The Ray wing: everything that knows Ray (the Ray executor and its worker
actors, their placement, the server actor, the warm pool of idle actors and
starting or joining a Ray session).

Only :mod:`fedsim.runtime` and the commands (:mod:`fedsim.tools`) import it
(tests/test_imports.py): the core reads, and runs in-process, with no actor
in sight.
"""
