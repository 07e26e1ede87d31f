"""The hostile-input corpus: `make_corpus` generates it (see DIFFERENCES.md for where npyfeed departs from numpy)."""
