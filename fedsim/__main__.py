"""``python -m fedsim``: the ``fedsim`` command without the console script."""

from fedsim.tools.cli import main

if __name__ == "__main__":
    main()
