"""Sphinx's configuration: the docs are the Markdown files where they are read on GitHub
(README.md, docs/*.md, benchmarks/README.md), built with MyST. tests/test_docs.py builds them
with warnings as errors, so a link to a missing page or heading fails the suite; nothing is
fetched at build time (the bundled theme, no intersphinx)."""

project = "mirrorflow"
copyright = "the mirrorflow authors"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "docs/index"
# The checkout's root is the source folder, so that README.md and benchmarks/README.md are pages
# too and every relative link resolves as it does on GitHub; only these files are pages.
include_patterns = ["README.md", "docs/*.md", "benchmarks/README.md"]
exclude_patterns = [".*", "**/.*", "**/__pycache__", "**/node_modules"]

# Anchors for headings down to ####, named as GitHub names them (`#the-two-commands`), so that
# `page.md#heading` links work in both places and a missing one is a warning.
myst_heading_anchors = 4

html_theme = "alabaster"
html_title = "mirrorflow"
html_show_sourcelink = False
html_copy_source = False
