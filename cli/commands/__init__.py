"""Subcommands of the codeclog CLI, one module each."""
