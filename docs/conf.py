"""Sphinx configuration of npyfeed's documentation: ``sphinx-build -W --keep-going -b html docs <out>``.

The API pages are generated from the docstrings of the *installed* npyfeed (``pip install '.[docs]'``): autodoc
imports the package, whose compiled core only exists once built. TensorFlow, Keras, PyTorch and JAX are mocked
(``autodoc_mock_imports``) so that the docs extra does not pull in their wheels: ``npyfeed.tf``, ``npyfeed.keras``
and ``npyfeed.torch`` are thin modules documented from their own signatures and docstrings, none of which a
framework computes. Nothing is fetched at
build time (no intersphinx): the docs build offline.
"""

import npyfeed

project = "npyfeed"
author = "the npyfeed authors"
copyright = "the npyfeed authors"
release = npyfeed.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "numpydoc",
    "sphinx.ext.autodoc",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build"]
myst_heading_anchors = 3
nitpicky = True  # every cross-reference must resolve (with -W, a broken one fails the build)

autodoc_mock_imports = ["tensorflow", "keras", "torch", "jax"]
autodoc_typehints = "none"  # numpydoc's Parameters sections already give the types
autodoc_member_order = "bysource"
numpydoc_show_class_members = False  # members are listed explicitly on the API page
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

html_theme = "pydata_sphinx_theme"
html_title = f"npyfeed {release}"
html_theme_options = {"navigation_with_keys": False, "show_toc_level": 2}
html_static_path = []
