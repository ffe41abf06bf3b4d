"""`python -m submitter` is the same as the `submitter` command."""

from submitter.cli import main

if __name__ == "__main__":
    main()
