"""Passes over fusionc IR, one per file, and the pipeline driver.

- design v2 (:mod:`.stream`): ``partition-units`` (the unit schedule), ``stream-plan`` (tiles
  through a TMA-fed ring), ``insert-barriers`` (the ring's waits and proxy fences),
  ``smem-plan`` (ring depth from the shared-memory budget); before them ``fold-views``
  (:mod:`.fold_views`: views moved past elementwise ops and cancelled) and
  ``fuse-allreduce-norm`` (:mod:`.fuse_allreduce_norm`);
- ``attention-units`` (:mod:`.attention_units`: attention cores as units kernels, alone before
  ``lower-library`` on the mixed path);
- ``lower-library`` (:mod:`.lower_library`: linears as cuBLAS GEMMs) and ``split-tokens``
  (:mod:`.split_tokens`: token blocks whose collectives overlap the next block's GEMMs).
"""
from fusionc.passes import fold_views, fuse_allreduce_norm, lower_library  # noqa: F401
from fusionc.passes import split_tokens, stream  # noqa: F401
from fusionc.passes.base import PASSES, Pass, register_pass
from fusionc.passes.pipeline import DEFAULT_PIPELINE, parse_pipeline, run_pipeline

__all__ = ["PASSES", "Pass", "register_pass", "DEFAULT_PIPELINE", "parse_pipeline",
           "run_pipeline"]
