"""`python -m adapterdoc` entry point."""

from adapterdoc.cli import main

if __name__ == "__main__":
    main()
