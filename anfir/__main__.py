"""``python -m anfir`` is the ``anfir`` command."""

from anfir.cli import console

if __name__ == "__main__":
    console()
