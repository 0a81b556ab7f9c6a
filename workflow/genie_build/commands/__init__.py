"""One module per CLI command; see :mod:`genie_build.cli`."""
