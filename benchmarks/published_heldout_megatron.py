"""Held-out published runs of the Megatron lineage and Meta (NeoX, Pythia, MT-NLG, Llama 3, Korthikanti et al.,
Megatron-LM's README, OPT): collected on another branch; this empty table stands in for it until the lead merges it.
``python benchmarks/published_results.py --held-out`` plans its ``ROWS`` with benchmarks/published_heldout.py's."""

from __future__ import annotations

from published_results import Published

ROWS: tuple[Published, ...] = ()
