"""``python -m beacon.cli``: the same as the ``beacon`` console script."""

from beacon.cli import main

if __name__ == "__main__":
    main()
