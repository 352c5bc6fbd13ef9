"""`python -m adapterdoc` entry point."""

from adapterdoc.cli import run

if __name__ == "__main__":
    run()
