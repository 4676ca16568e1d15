"""``python -m beacon``: the ``beacon`` command line (:mod:`beacon.cli`)."""

from beacon.cli import main

if __name__ == "__main__":
    main()
