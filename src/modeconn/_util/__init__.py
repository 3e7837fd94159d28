"""Shared infrastructure (internal): atomic file and directory writes, output-directory ownership."""
