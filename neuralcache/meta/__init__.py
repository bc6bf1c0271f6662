"""Metadata at scale: the table of listed entries (rows), listing directories as they
are used (lister), listings brought by the user (manifest)."""
